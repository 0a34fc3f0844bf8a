// Stacks rows that lie anywhere in device memory into one contiguous tensor in one launch:
//   dst[row0 + r, i] = src[r][i]    for r < gridDim.y (at most GATHER_MAX_ROWS), i < n
// (reference: candle's `Tensor::cat` along the batch dimension, one copy kernel per row). Used to
// stack the Code2Wav streams' convolution states for a batched pass: 30-40 layers a pass, each a
// copy per stream. Elements are moved as 2- or 4-byte words (bf16 / f32).
// Launch: grid (column blocks, rows in this launch), block GATHER_THREADS threads.

#define GATHER_THREADS 256
#define GATHER_MAX_ROWS 32

struct RowPtrs {
    unsigned long long p[GATHER_MAX_ROWS];
};

template <typename U>
__device__ void gather_rows(RowPtrs src, U* __restrict__ dst, long n, int row0) {
    const int r = blockIdx.y;
    const U* __restrict__ s = reinterpret_cast<const U*>(src.p[r]);
    U* __restrict__ d = dst + (long)(row0 + r) * n;
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x)
        d[i] = s[i];
}

extern "C" __global__ void __launch_bounds__(GATHER_THREADS)
    gather_rows_u16(RowPtrs src, unsigned short* dst, long n, int row0) {
    gather_rows<unsigned short>(src, dst, n, row0);
}
extern "C" __global__ void __launch_bounds__(GATHER_THREADS)
    gather_rows_u32(RowPtrs src, unsigned int* dst, long n, int row0) {
    gather_rows<unsigned int>(src, dst, n, row0);
}
