// Typesets the formulas that pymdownx.arithmatex marked (elements of class
// "arithmatex", holding \(...\) or \[...\]) with KaTeX, on every page load, including
// Material's instant navigation. Only those elements: a "$" elsewhere is text.
document$.subscribe(({ body }) => {
  for (const element of body.querySelectorAll(".arithmatex")) {
    renderMathInElement(element, {
      delimiters: [
        { left: "\\(", right: "\\)", display: false },
        { left: "\\[", right: "\\]", display: true },
      ],
      throwOnError: false,
    });
  }
});
