// fp8_blas.cu — the FP8 ceiling (fp8_blas.hpp; its definitions: fp8_lt.cuh).
//
// What cuBLASLt offers for DeepSeek-V3's format on Hopper. The cuBLAS documentation, section 3.1.4
// ("Narrow Precision Data Types Usage"), "Scaling Mode Support Overview": "128-element 1D block
// scaling | 9.0 | CUDA_R_8F_E4M3 / CUDA_R_8F_E5M2 | CUDA_R_32F | Tensor" and "128x128-element 2D
// block scaling | 9.0 | ... | CUDA_R_32F | Tensor" (tensorwide scaling: 8.9+; the 32- and
// 16-element MX modes: 10.0+). Section 3.1.4.5, "128-element 1D and 128x128 2D Block Scaling For
// FP8 Data Types", applies block scaling "to the Hopper GPU architecture. However, here the
// scaling data type is CUDA_R_32F, and different scaling modes can be used for A and B, and the
// only supported precisions for D are CUDA_R_16F, CUDA_R_16BF, and CUDA_R_32F"; of the (A, B)
// modes, VEC128 x VEC128, VEC128 x BLK128x128 and BLK128x128 x VEC128 are "Yes", BLK128x128 x
// BLK128x128 "No". Layouts (3.1.4.5.1): "Starting addresses of scaling factors must be 16B
// aligned", "M and N must be multiples of 4"; VEC128_32F scales are "M-major for A with shape
// M x L" and "N-major for B with shape N x L" (L = ceil(K/128)); BLK128x128_32F scales "are
// K-major and the stride between the consecutive columns must be a multiple of 4", shape
// L4 x ceil(M/128) for A (L4: L rounded up to a multiple of 4). cublasLtMatmul() needs for FP8
// "A must be transposed and B non-transposed (The "TN" format) on ... Hopper (compute capability
// 9.0)", CUBLAS_COMPUTE_32F, scale type CUDA_R_32F, 16-byte aligned pointers and dimensions.
// cublasLt.h here (cuBLAS 13.1) declares CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F = 4 ("a dedicated
// CUDA_R_32F scaling factor for each 128-element block in the innermost dimension") and
// CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F = 5 ("for each 128x128-element block"). So an FP8
// baseline can run DeepSeek-V3's scales as they are, with no per-tensor requantization.
#include "fp8_lt.cuh"
