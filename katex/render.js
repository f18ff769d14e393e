// Typesets formulas for the documentation build (docs/hooks.py starts it once per
// build): one JSON request per line on stdin, {"tex": ..., "display": bool}, one
// JSON answer per line on stdout, {"html": ...} or {"error": ...}.
const katex = require("katex");
const readline = require("readline");

const lines = readline.createInterface({ input: process.stdin, terminal: false });
lines.on("line", (line) => {
  const { tex, display } = JSON.parse(line);
  let answer;
  try {
    answer = { html: katex.renderToString(tex, { displayMode: display, throwOnError: true }) };
  } catch (error) {
    answer = { error: String(error.message || error) };
  }
  process.stdout.write(JSON.stringify(answer) + "\n");
});
