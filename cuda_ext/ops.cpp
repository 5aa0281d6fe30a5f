// The densecnn operator library: every op's schema, declared once. Kernels are registered per device in
// pool_cpu.cpp / conv_cpu.cpp (CPU) and pool_cuda.cpp / conv_cuda.cpp (CUDA); autograd and fake (meta) kernels
// are registered from Python (densecnn/ops/registrations.py). Importing the module `densecnn._C` runs these
// registrations.
#include <Python.h>
#include <torch/library.h>

#include "cpu_isa.h"
#include "gpu_loops.h"
#include "output_buffers.h"

namespace densecnn {

std::atomic<bool>& gpu_loops_on_cpu() {
  static std::atomic<bool> enabled{false};
  return enabled;
}

namespace {

bool use_gpu_loops_on_cpu(bool enable) { return gpu_loops_on_cpu().exchange(enable); }

int64_t release_output_buffers() { return OutputCache::instance().release(); }

at::Tensor empty_buffer(at::IntArrayRef size, at::ScalarType dtype) {
  return empty_output(size, at::TensorOptions().dtype(dtype));
}

std::string cpu_isa() { return dispatched_isa(); }

void set_output_buffers(int64_t max_free_bytes, bool huge_pages) {
  TORCH_CHECK(max_free_bytes >= 0, "set_output_buffers: max_free_bytes must be 0 or more, got ", max_free_bytes);
  huge_pages_enabled().store(huge_pages, std::memory_order_relaxed);
  OutputCache::instance().set_limit(max_free_bytes);
}

}  // namespace
}  // namespace densecnn

TORCH_LIBRARY(densecnn, m) {
  // Stride-1 dilated max pooling over the n = len(kernel) spatial axes of an (N, C, L), (N, C, H, W) or
  // (N, C, D, H, W) input, fused with `activation` ("none", "relu", "tanh"). With with_taps, also the argmax as
  // uint8 tap numbers, one tensor per axis a: which of the window's k[a] taps along a won, for every output of the
  // pass along a (passes run innermost axis first, so taps[a] has the axes from a on pooled); otherwise [].
  m.def(
      "max_pool(Tensor input, int[] kernel, int[] dilation, str activation, bool with_taps) "
      "-> (Tensor, Tensor[])");
  m.def(
      "max_pool_backward(Tensor grad_output, Tensor? output, Tensor[] taps, int[] kernel, int[] dilation, "
      "str activation) -> Tensor");
  // Stride-1 dilated average pooling: activation(sum of the window's taps / divisor).
  m.def("avg_pool(Tensor input, int[] kernel, int[] dilation, int divisor, str activation) -> Tensor");
  m.def(
      "avg_pool_backward(Tensor grad_output, Tensor? output, int[] kernel, int[] dilation, int divisor, "
      "str activation) -> Tensor");
  // Stride-1 dilated convolution by im2col (built in bands of output rows) and a GEMM.
  m.def("conv2d(Tensor input, Tensor weight, Tensor? bias, int[2] dilation, int groups) -> Tensor");
  // Gradients w.r.t. (input, weight, bias); an entry whose output_mask is false comes back empty.
  m.def(
      "conv2d_backward(Tensor grad_output, Tensor input, Tensor weight, int[2] dilation, int groups, "
      "bool[3] output_mask) -> (Tensor, Tensor, Tensor)");
  // Stride-1 dilated convolution, groups 1, of (N, C, *S) with 1-3 spatial axes, computed directly (no im2col):
  // for convs with few input channels. Its gradients are torch's convolution backward (densecnn/ops/registrations.py).
  m.def("direct_conv(Tensor input, Tensor weight, Tensor? bias, int[] dilation) -> Tensor");
  // Stride-1 dilated convolution in the frequency domain on overlap-save tiles of the sub-grids (fft_driver.h) of
  // the input zero-padded by `padding` (rows, columns) on each side (never materialised): `spectrum` is the
  // kernel's conj(DFT) on the th×tw tile, complex (th·(tw/2+1), C, K); valid = tile - kernel + 1.
  // `weight` (K, C, kh, kw) is the weight the spectrum was made from: the kernels read only the spectrum, the
  // gradients are taken for the weight (densecnn/ops/registrations.py).
  m.def(
      "fft_conv2d(Tensor input, Tensor weight, Tensor spectrum, Tensor? bias, int[2] tile, int[2] valid, "
      "int[2] dilation, int[2] padding=[0, 0]) -> Tensor");
  // The input gradient (N, C, *input_size) of fft_conv2d from the output gradient grad_output (N, K, H', W'): the
  // adjoint of overlap-save on the forward's tiles, with the forward's kernel spectrum (fft_driver.h).
  m.def(
      "fft_conv2d_input_grad(Tensor grad_output, Tensor spectrum, int[2] input_size, int[2] tile, int[2] valid, "
      "int[2] dilation, int[2] padding=[0, 0]) -> Tensor");
  // The spectrum of fft_conv2d's weight gradient for the output gradient grad_output (N, K, H', W'): the sum over
  // the tiles of X · conj(G), complex (th·(tw/2+1), C, K), in the layout of the kernel spectrum (fft_driver.h).
  m.def(
      "fft_conv2d_weight_spectrum(Tensor input, Tensor grad_output, int[2] tile, int[2] valid, int[2] dilation) "
      "-> Tensor");
  // An unpadded fft_conv2d that also returns its input's tile spectra (tiles·th·(tw/2+1)·C·2 real values), for
  // fft_conv2d_backward's weight gradient (fft_driver.h).
  m.def(
      "fft_conv2d_with_input_spectra(Tensor input, Tensor weight, Tensor spectrum, Tensor? bias, int[2] tile, "
      "int[2] valid, int[2] dilation) -> (Tensor, Tensor)");
  // Both gradients of an unpadded fft_conv2d at once: (fft_conv2d_input_grad's, fft_conv2d_weight_spectrum's, and
  // the output gradient summed over all but its channels: the bias's gradient (K,)), the output gradient's tiles
  // transformed once for the three, the input's taken from input_spectra when the forward kept them (fft_driver.h).
  m.def(
      "fft_conv2d_backward(Tensor input, Tensor grad_output, Tensor spectrum, int[2] tile, int[2] valid, "
      "int[2] dilation, Tensor? input_spectra=None) -> (Tensor, Tensor, Tensor)");
  // Stride-1 dilated 3×3 / 3×3×3 convolution by Winograd's F(m, 3) (winograd.h), chunk by chunk of tiles: input
  // transform, V[ξ] @ kernel[ξ] against the transformed kernel (α^n, C, K), α = m + 2, output transform (+ bias)
  // -> (N, K, ...) in the input's memory format. `weight` (K, C, 3, ...) is the weight the kernel was transformed
  // from, taken for the gradients as fft_conv2d's.
  // `padding`: zero pixels before and after the input along each axis, read as zeros (never materialised); [] none.
  m.def(
      "winograd_conv(Tensor input, Tensor weight, Tensor kernel, Tensor? bias, int[] dilation, int m, "
      "int[] padding=[]) -> Tensor");
  // The transformed form of winograd_conv's weight gradient for the output gradient grad_output (N, K, *O): Σ over
  // the tiles of V[ξ]ᵀ z[ξ], (α^n, C, K), V the input's transform and z = A·g·Aᵀ the output gradient's (winograd.h);
  // the weight's gradient is Gᵀ·(it)·G along every axis (densecnn/ops/winograd.py). Second, the bias's gradient
  // (K,): Σ over the tiles of z at winograd_sum_point, the output gradient's sum, read off the tiles' transforms.
  m.def("winograd_conv_weight_grad(Tensor input, Tensor grad_output, int[] dilation, int m) -> (Tensor, Tensor)");
  // out[a', b', n] = Σ_a Σ_b first[a', a] · second[b', b] · x[a, b, n] for complex x (A, B, N), first (A', A),
  // second (B', B), written into the contiguous out (A', B', N) (CPU only): the FFT conv's kernel spectrum from its
  // taps and the weight gradient's taps from its spectrum (densecnn/ops/fft_conv.py).
  m.def("axes_transform(Tensor x, Tensor first, Tensor second, Tensor(a!) out) -> ()");
  // x (N, C, ...) in NC* memory, from a channels-last x (CPU: transposed block by block of pixels).
  m.def("channels_first(Tensor x) -> Tensor");
  // x (N, C, ...) in channels-last memory, from an NC* x (CPU: the same blocks, the other way).
  m.def("channels_last(Tensor x) -> Tensor");
  // Frees the cached output buffers nothing refers to (output_buffers.h); returns the bytes released.
  m.def("release_output_buffers() -> int", &densecnn::release_output_buffers);
  // An uninitialised contiguous CPU tensor on a block of the output buffers (output_buffers.h), for the large
  // results Python computes anew on every call with out= ops (the FFT solver's kernel spectrum in training).
  m.def("empty_buffer(int[] size, ScalarType dtype) -> Tensor", &densecnn::empty_buffer);
  // The output buffers' settings (output_buffers.h): at most max_free_bytes of free buffers kept for reuse (0: none),
  // fresh ones advised onto huge pages or not. The library reads no environment: densecnn.ops.config calls this
  // when the library loads and whenever the config changes.
  m.def("set_output_buffers(int max_free_bytes, bool huge_pages) -> ()", &densecnn::set_output_buffers);
  // The instruction set the CPU loops dispatched to on this CPU (cpu_isa.h): "x86-64-v4", "x86-64-v3" or "x86-64".
  m.def("cpu_isa() -> str", &densecnn::cpu_isa);
  // Tests only: run the CUDA kernels' per-element bodies on the CPU (gpu_loops.h). Returns the previous setting.
  m.def("_use_gpu_loops_on_cpu(bool enable) -> bool", &densecnn::use_gpu_loops_on_cpu);
}

// A bare Python module: loading it is what registers the ops above.
extern "C" PyMODINIT_FUNC PyInit__C(void) {
  static PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", "densecnn's compiled operators (torch.ops.densecnn)",
                               -1, nullptr};
  return PyModule_Create(&module);
}
