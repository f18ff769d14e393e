// eqxopt's element-wise step kernel for XLA:CPU, called through `jax.ffi`.
//
// `_fused.py` turns an optimizer's per-leaf rule into a small C function (one loop
// over the elements, every intermediate in registers), compiles it once per rule
// and registers its address here under a 64-bit id. This handler runs that
// function over one leaf, splitting large leaves across threads. XLA:CPU would
// instead run one single-threaded loop per output (new parameter, each moment),
// reading the inputs again for each.
//
// Buffers: `scalars` (float32[k]: hyperparameters, bias corrections, literals),
// then the leaf's inputs, then its outputs; every leaf buffer is float32 and all
// have one element count. Outputs may alias inputs (in-place, donated steps): the
// generated loop reads element i of every input before writing element i.

#include "common.h"

namespace {

// Runs `fn` over one leaf of `n` elements, on the pool if the leaf is large.
void RunLeaf(KernelFn fn, const std::vector<const float*>& in,
             const std::vector<float*>& out, const float* s, int64_t n) {
  const int64_t n_tasks = TaskCount(n, n);
  if (n_tasks == 1) {
    fn(in.data(), out.data(), s, n);
    return;
  }
  const int64_t per = ((n + n_tasks - 1) / n_tasks + kAlign - 1) / kAlign * kAlign;
  RunTasks(n_tasks, [&](int64_t task) {
    const int64_t begin = task * per, end = std::min(n, begin + per);
    if (begin < end) {
      std::vector<const float*> in_at(in.size());
      std::vector<float*> out_at(out.size());
      for (size_t i = 0; i < in.size(); ++i) in_at[i] = in[i] + begin;
      for (size_t o = 0; o < out.size(); ++o) out_at[o] = out[o] + begin;
      fn(in_at.data(), out_at.data(), s, end - begin);
    }
  });
}

ffi::Error Elementwise(ffi::Buffer<ffi::F32> scalars, ffi::RemainingArgs args,
                       ffi::RemainingRets rets, int64_t kernel, int64_t n_in) {
  KernelFn fn = lookup(kernel);
  if (fn == nullptr) return NotLoaded("element-wise");
  // Leaf-major: leaf j's inputs are arguments [j * n_in, (j + 1) * n_in), its
  // outputs results [j * n_out, (j + 1) * n_out).
  const int64_t n_args = static_cast<int64_t>(args.size());
  if (n_in <= 0 || n_args == 0 || n_args % n_in != 0 ||
      static_cast<int64_t>(rets.size()) % (n_args / n_in) != 0) {
    return ffi::Error::InvalidArgument("eqxopt: argument counts do not match");
  }
  const int64_t n_leaves = n_args / n_in;
  const int64_t n_out = static_cast<int64_t>(rets.size()) / n_leaves;
  const float* s = scalars.typed_data();
  std::vector<const float*> in(n_in);
  std::vector<float*> out(n_out);
  for (int64_t leaf = 0; leaf < n_leaves; ++leaf) {
    int64_t n = -1;
    for (int64_t i = 0; i < n_in; ++i) {
      auto buf = args.get<ffi::AnyBuffer>(leaf * n_in + i);
      if (!buf.has_value() || buf->element_type() != ffi::F32) {
        return ffi::Error::InvalidArgument("eqxopt: inputs must be float32");
      }
      const int64_t count = static_cast<int64_t>(buf->element_count());
      if (n >= 0 && count != n) {
        return ffi::Error::InvalidArgument("eqxopt: inputs differ in size");
      }
      n = count;
      in[i] = reinterpret_cast<const float*>(buf->untyped_data());
    }
    for (int64_t o = 0; o < n_out; ++o) {
      auto buf = rets.get<ffi::AnyBuffer>(leaf * n_out + o);
      if (!buf.has_value() || (*buf)->element_type() != ffi::F32 ||
          static_cast<int64_t>((*buf)->element_count()) != n) {
        return ffi::Error::InvalidArgument("eqxopt: outputs must match the inputs");
      }
      out[o] = reinterpret_cast<float*>((*buf)->untyped_data());
    }
    RunLeaf(fn, in, out, s, n);
  }
  return ffi::Error::Success();
}

// `Packed` (eqxopt.pack): one flat buffer cut into many leaves and back, as plain
// copies. XLA:CPU would compile each slice at its own offset into a kernel of its
// own (minutes for a few thousand leaves); here the whole cut is one call.
ffi::Error Split(ffi::AnyBuffer flat, ffi::RemainingRets parts) {
  const char* src = static_cast<const char*>(flat.untyped_data());
  size_t offset = 0;
  for (size_t k = 0; k < parts.size(); ++k) {
    auto part = parts.get<ffi::AnyBuffer>(k);
    if (!part.has_value()) return ffi::Error::InvalidArgument("eqxopt: bad split");
    const size_t bytes = (*part)->size_bytes();
    if (offset + bytes > flat.size_bytes())
      return ffi::Error::InvalidArgument("eqxopt: split parts exceed the buffer");
    std::memcpy((*part)->untyped_data(), src + offset, bytes);
    offset += bytes;
  }
  if (offset != flat.size_bytes())
    return ffi::Error::InvalidArgument("eqxopt: split parts do not fill the buffer");
  return ffi::Error::Success();
}

ffi::Error Concat(ffi::RemainingArgs parts, ffi::Result<ffi::AnyBuffer> flat) {
  char* dst = static_cast<char*>(flat->untyped_data());
  size_t offset = 0;
  for (size_t k = 0; k < parts.size(); ++k) {
    auto part = parts.get<ffi::AnyBuffer>(k);
    if (!part.has_value()) return ffi::Error::InvalidArgument("eqxopt: bad concat");
    const size_t bytes = part->size_bytes();
    if (offset + bytes > flat->size_bytes())
      return ffi::Error::InvalidArgument("eqxopt: concat parts exceed the buffer");
    std::memcpy(dst + offset, part->untyped_data(), bytes);
    offset += bytes;
  }
  if (offset != flat->size_bytes())
    return ffi::Error::InvalidArgument("eqxopt: concat parts do not fill the buffer");
  return ffi::Error::Success();
}

}  // namespace

extern "C" {

// Called from Python (ctypes) when the library loads, before any kernel runs.
void eqxopt_set_num_threads(int64_t cap) { thread_cap.store(cap); }

// Called from Python (ctypes) once a rule's function is loaded.
void eqxopt_register_kernel(int64_t id, void* fn) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  registry()[id] = reinterpret_cast<KernelFn>(fn);
}

}  // extern "C"

XLA_FFI_DEFINE_HANDLER_SYMBOL(EqxoptElementwise, Elementwise, StepBinding("n_in"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(EqxoptSplit, Split,
                              ffi::Ffi::Bind().Arg<ffi::AnyBuffer>().RemainingRets());
XLA_FFI_DEFINE_HANDLER_SYMBOL(EqxoptConcat, Concat,
                              ffi::Ffi::Bind().RemainingArgs().Ret<ffi::AnyBuffer>());
