// ferroccl reduction kernels, compiled at run time by NVRTC (src/cuda/kernels.rs).
//
// No #include: NVRTC must build this without any CUDA toolkit header. The arithmetic is the
// host path's (src/coll/reduce.rs) transcribed bit for bit:
// - integers wrap around (computed on the unsigned storage type); max/min compare signed
//   values for signed types; the average divides truncating toward zero;
// - f32/f64 use IEEE round-to-nearest-even intrinsics (__fadd_rn and friends are never fused
//   into an FMA), and every NaN result is the canonical quiet NaN;
// - f16, bf16, e4m3 and e5m2 are widened to f32 exactly, computed in f32 and rounded back once
//   with the same branch-free conversions as reduce.rs (fp8 saturates like __NV_SATFINITE,
//   except that e5m2 keeps +-Inf);
// - max(+0, -0) = +0 and min(+0, -0) = -0 whatever the order; NaN wins in max/min.
//
// One kernel per (type, operator): ferroccl_fold_<type>_<op>, with
//   out[i] = post(pre_0(in_0[i]) op pre_1(in_1[i]) op ... op pre_{n-1}(in_{n-1}[i]))
// folded left to right. Inputs may alias the output: a thread reads every input of an element
// before it writes that element, and no two threads share an element.
//
// Compile with --fmad=false --ftz=false --prec-div=true (kernels.rs does): the explicit _rn
// intrinsics do not depend on them, but nothing else may either.

typedef unsigned char u8;
typedef signed char i8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef int i32;
typedef unsigned long long u64;
typedef long long i64;

#define FERROCCL_MAX_INPUTS 16

// Kernel parameters, by value. Must match `FoldParams` in kernels.rs (568 bytes).
struct FoldParams {
    void* out;
    const void* in[FERROCCL_MAX_INPUTS];
    // The PreMulSum scalar of input k as raw little-endian bytes (low sizeof(T) bytes used),
    // used when pre_ptr[k] is NULL.
    u64 pre_bits[FERROCCL_MAX_INPUTS];
    // A device-resident scalar of the element type (ncclScalarDevice), or NULL.
    const void* pre_ptr[FERROCCL_MAX_INPUTS];
    u64 count;
    // Integer-average divisor; 0 = no post step.
    u64 post_div;
    int n_in;
    // Bit k set: input k is multiplied by its scalar before it is folded in.
    u32 pre_mask;
    // More buffers that receive the same result (an all-reduce's other ranks); each may be one
    // of the inputs, as out may.
    u64 n_more;
    void* more_out[FERROCCL_MAX_INPUTS];
    // More than 1: several operations in one launch; `count` elements per group, every pointer
    // and group_bytes 16-byte aligned, count a whole number of 16-byte packs.
    // - One input (a grouped copy: an all-gather, a gather): group g copies in[g] to out and
    //   to every more_out, each at offset g * group_bytes.
    // - Several inputs (a grouped fold: a reduce-scatter): group g folds every input at offset
    //   g * group_bytes into out (g = 0) or more_out[g - 1].
    u64 groups;
    u64 group_bytes;
};

// ---------------------------------------------------------------------------------------------
// f32 and f64 on raw bits.

static __device__ __forceinline__ float f32_of(u32 b) { return __uint_as_float(b); }
static __device__ __forceinline__ u32 bits_of(float x) { return __float_as_uint(x); }
static __device__ __forceinline__ double f64_of(u64 b) { return __longlong_as_double((i64)b); }
static __device__ __forceinline__ u64 bits_of64(double x) { return (u64)__double_as_longlong(x); }

static __device__ __forceinline__ bool nan32(u32 b) { return (b & 0x7fffffffu) > 0x7f800000u; }
static __device__ __forceinline__ bool nan64(u64 b) {
    return (b & 0x7fffffffffffffffull) > 0x7ff0000000000000ull;
}
static __device__ __forceinline__ u32 canon32(u32 b) { return nan32(b) ? 0x7fc00000u : b; }
static __device__ __forceinline__ u64 canon64(u64 b) { return nan64(b) ? 0x7ff8000000000000ull : b; }

struct F32 {
    typedef u32 S;
    static __device__ __forceinline__ S add(S a, S b) { return canon32(bits_of(__fadd_rn(f32_of(a), f32_of(b)))); }
    static __device__ __forceinline__ S mul(S a, S b) { return canon32(bits_of(__fmul_rn(f32_of(a), f32_of(b)))); }
    static __device__ __forceinline__ S max(S a, S b) {
        float x = f32_of(a), y = f32_of(b);
        // Equal values have equal bits except +0/-0, where AND gives +0.
        S m = (y > x) ? b : (a & b);
        m = (x > y) ? a : m;
        return (nan32(a) || nan32(b)) ? 0x7fc00000u : m;
    }
    static __device__ __forceinline__ S min(S a, S b) {
        float x = f32_of(a), y = f32_of(b);
        // Equal values have equal bits except +0/-0, where OR gives -0.
        S m = (y < x) ? b : (a | b);
        m = (x < y) ? a : m;
        return (nan32(a) || nan32(b)) ? 0x7fc00000u : m;
    }
    static __device__ __forceinline__ S div(S a, u64 n) {
        return canon32(bits_of(__fdiv_rn(f32_of(a), __ull2float_rn(n))));
    }
};

struct F64 {
    typedef u64 S;
    static __device__ __forceinline__ S add(S a, S b) { return canon64(bits_of64(__dadd_rn(f64_of(a), f64_of(b)))); }
    static __device__ __forceinline__ S mul(S a, S b) { return canon64(bits_of64(__dmul_rn(f64_of(a), f64_of(b)))); }
    static __device__ __forceinline__ S max(S a, S b) {
        double x = f64_of(a), y = f64_of(b);
        S m = (y > x) ? b : (a & b);
        m = (x > y) ? a : m;
        return (nan64(a) || nan64(b)) ? 0x7ff8000000000000ull : m;
    }
    static __device__ __forceinline__ S min(S a, S b) {
        double x = f64_of(a), y = f64_of(b);
        S m = (y < x) ? b : (a | b);
        m = (x < y) ? a : m;
        return (nan64(a) || nan64(b)) ? 0x7ff8000000000000ull : m;
    }
    static __device__ __forceinline__ S div(S a, u64 n) {
        return canon64(bits_of64(__ddiv_rn(f64_of(a), __ull2double_rn(n))));
    }
};

// ---------------------------------------------------------------------------------------------
// Narrow floats: the conversions of reduce.rs, step for step (all select, no data-dependent
// branch needed; f32 adds run with denormals kept since --ftz=false).

static __device__ __forceinline__ float f16_to_f32(u32 h) {
    const u32 shifted_exp = 0x7c00u << 13;
    const u32 magic = 113u << 23; // 2^-14
    u32 o = (h & 0x7fffu) << 13;
    u32 exp = o & shifted_exp;
    u32 normal = o + ((127u - 15u) << 23);
    u32 inf_nan = normal + ((128u - 16u) << 23);
    u32 subnormal = bits_of(__fsub_rn(f32_of(o + magic), f32_of(magic)));
    u32 r = (exp == shifted_exp) ? inf_nan : normal;
    r = (exp == 0) ? subnormal : r;
    return f32_of(r | ((h & 0x8000u) << 16));
}

static __device__ __forceinline__ u16 f32_to_f16(float x) {
    const u32 f32_inf = 255u << 23;
    const u32 f16_overflow = (127u + 16u) << 23;
    const u32 denorm_magic = ((127u - 15u) + (23u - 10u) + 1u) << 23;
    u32 bits = bits_of(x);
    u32 sign = bits & 0x80000000u;
    u32 u = bits ^ sign;
    u32 subnormal = bits_of(__fadd_rn(f32_of(u), f32_of(denorm_magic))) - denorm_magic;
    u32 mant_odd = (u >> 13) & 1u;
    // ((15 - 127) << 23) + 0xfff as a wrapping u32.
    u32 normal = (u + 0xc8000fffu + mant_odd) >> 13;
    u32 o = (u < (113u << 23)) ? subnormal : normal;
    o = (u >= f16_overflow) ? 0x7c00u : o;
    o = o | (sign >> 16);
    return (u16)((u > f32_inf) ? 0x7e00u : o);
}

static __device__ __forceinline__ float bf16_to_f32(u32 h) { return f32_of(h << 16); }

static __device__ __forceinline__ u16 f32_to_bf16(float x) {
    u32 bits = bits_of(x);
    u32 rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
    return (u16)(nan32(bits) ? 0x7fc0u : rounded);
}

static __device__ __forceinline__ float e4m3_to_f32(u32 b) {
    const u32 magic = 121u << 23; // 2^-6
    u32 o = (b & 0x7fu) << 20;
    u32 normal = o + ((127u - 7u) << 23);
    u32 subnormal = bits_of(__fsub_rn(f32_of(o + magic), f32_of(magic)));
    u32 r = ((b & 0x78u) == 0) ? subnormal : normal;
    r = ((b & 0x7fu) == 0x7fu) ? 0x7fc00000u : r;
    return f32_of(r | ((b & 0x80u) << 24));
}

static __device__ __forceinline__ float e5m2_to_f32(u32 b) { return f16_to_f32(b << 8); }

static __device__ __forceinline__ u8 f32_to_e4m3(float x) {
    const u32 sat_above = 0x43e80000u;           // 464.0
    const u32 min_normal = 121u << 23;           // 2^-6
    const u32 denorm_magic = (127u + 14u) << 23; // 2^14: its f32 ulp is 2^-9
    u32 bits = bits_of(x);
    u32 sign = (bits >> 24) & 0x80u;
    u32 u = bits & 0x7fffffffu;
    u32 normal = ((u + 0x7ffffu + ((u >> 20) & 1u)) >> 20) - ((127u - 7u) << 3);
    u32 subnormal = bits_of(__fadd_rn(f32_of(u), f32_of(denorm_magic))) - denorm_magic;
    u32 o = (u >= min_normal) ? normal : subnormal;
    o = (u > sat_above) ? 0x7eu : o;
    o = o | sign;
    return (u8)((u > 0x7f800000u) ? 0x7fu : o);
}

static __device__ __forceinline__ u8 f32_to_e5m2(float x) {
    const u32 sat_from = 0x47700000u;           // 61440.0
    const u32 min_normal = 113u << 23;          // 2^-14
    const u32 denorm_magic = (127u + 7u) << 23; // 2^7: its f32 ulp is 2^-16
    u32 bits = bits_of(x);
    u32 sign = (bits >> 24) & 0x80u;
    u32 u = bits & 0x7fffffffu;
    u32 normal = ((u + 0xfffffu + ((u >> 21) & 1u)) >> 21) - ((127u - 15u) << 2);
    u32 subnormal = bits_of(__fadd_rn(f32_of(u), f32_of(denorm_magic))) - denorm_magic;
    u32 o = (u >= min_normal) ? normal : subnormal;
    o = (u >= sat_from) ? 0x7bu : o;
    o = (u == 0x7f800000u) ? 0x7cu : o;
    o = o | sign;
    return (u8)((u > 0x7f800000u) ? 0x7eu : o);
}

// A narrow type computed in f32: W widens exactly, N rounds back (canonical NaN).
template <typename St, float (*W)(u32), St (*N)(float)>
struct Narrow {
    typedef St S;
    static __device__ __forceinline__ S add(S a, S b) { return N(__fadd_rn(W(a), W(b))); }
    static __device__ __forceinline__ S mul(S a, S b) { return N(__fmul_rn(W(a), W(b))); }
    static __device__ __forceinline__ S max(S a, S b) { return N(f32_of(F32::max(bits_of(W(a)), bits_of(W(b))))); }
    static __device__ __forceinline__ S min(S a, S b) { return N(f32_of(F32::min(bits_of(W(a)), bits_of(W(b))))); }
    static __device__ __forceinline__ S div(S a, u64 n) { return N(__fdiv_rn(W(a), __ull2float_rn(n))); }
};

typedef Narrow<u16, f16_to_f32, f32_to_f16> F16;
typedef Narrow<u16, bf16_to_f32, f32_to_bf16> BF16;
typedef Narrow<u8, e4m3_to_f32, f32_to_e4m3> E4M3;
typedef Narrow<u8, e5m2_to_f32, f32_to_e5m2> E5M2;

// ---------------------------------------------------------------------------------------------
// Integers, stored unsigned (wrap-around is defined there); Sg is the signed view.

template <typename U, typename Sg, bool Signed>
struct Int {
    typedef U S;
    static __device__ __forceinline__ S add(S a, S b) { return (S)(a + b); }
    static __device__ __forceinline__ S mul(S a, S b) { return (S)((u64)a * (u64)b); }
    static __device__ __forceinline__ S max(S a, S b) {
        if (Signed) return ((Sg)a > (Sg)b) ? a : b;
        return (a > b) ? a : b;
    }
    static __device__ __forceinline__ S min(S a, S b) {
        if (Signed) return ((Sg)a < (Sg)b) ? a : b;
        return (a < b) ? a : b;
    }
    // Truncating toward zero; n > 0.
    static __device__ __forceinline__ S div(S a, u64 n) {
        if (!Signed) return (S)((u64)a / n);
        i64 v = (i64)(Sg)a;
        if (n <= 0x7fffffffffffffffull) return (S)(u64)(v / (i64)n);
        // n >= 2^63 > |v| unless v = -2^63 and n = 2^63.
        return (v == (i64)0x8000000000000000ull && n == 0x8000000000000000ull) ? (S)~(u64)0 : (S)0;
    }
};

typedef Int<u8, i8, true> I8;
typedef Int<u8, u8, false> U8;
typedef Int<u32, i32, true> I32;
typedef Int<u32, u32, false> U32;
typedef Int<u64, i64, true> I64;
typedef Int<u64, u64, false> U64;

// ---------------------------------------------------------------------------------------------
// The fold.

enum { OP_SUM = 0, OP_PROD = 1, OP_MAX = 2, OP_MIN = 3 };

template <typename T, int OP>
static __device__ __forceinline__ typename T::S apply(typename T::S a, typename T::S b) {
    if (OP == OP_SUM) return T::add(a, b);
    if (OP == OP_PROD) return T::mul(a, b);
    if (OP == OP_MAX) return T::max(a, b);
    return T::min(a, b);
}

struct alignas(16) Vec16 {
    u64 lo, hi;
};

template <typename T>
union Pack {
    Vec16 v;
    typename T::S e[16 / sizeof(typename T::S)];
};

// One element: reads in_0..in_{n-1} at index i, then writes out at i.
template <typename T, int OP>
static __device__ __forceinline__ void fold_one(const FoldParams& p, const typename T::S* scal, u64 i) {
    typedef typename T::S S;
    S acc = ((const S*)p.in[0])[i];
    if (p.pre_mask & 1u) acc = T::mul(acc, scal[0]);
    for (int k = 1; k < p.n_in; ++k) {
        S x = ((const S*)p.in[k])[i];
        if ((p.pre_mask >> k) & 1u) x = T::mul(x, scal[k]);
        acc = apply<T, OP>(acc, x);
    }
    if (p.post_div != 0) acc = T::div(acc, p.post_div);
    ((S*)p.out)[i] = acc;
    for (u64 m = 0; m < p.n_more; ++m) ((S*)p.more_out[m])[i] = acc;
}

// A 16-byte store that bypasses L2 retention (evict-first): large outputs are not read again
// by the kernel, and keeping them would only push out the inputs still to be read.
static __device__ __forceinline__ void store_streaming(Vec16* at, Vec16 v) {
#ifdef __CUDA_ARCH__
    asm volatile("st.global.cs.v2.u64 [%0], {%1, %2};" ::"l"(at), "l"(v.lo), "l"(v.hi) : "memory");
#else
    *at = v;  // the host build of the tests (tests/it/cuda_kernels.rs)
#endif
}

static __device__ __forceinline__ void store16(Vec16* at, Vec16 v, bool streaming) {
    if (streaming) {
        store_streaming(at, v);
    } else {
        *at = v;
    }
}

// From this many bytes per output, outputs are written with streaming stores (fanout_bw.cu on
// the H200: one source to 4 or 8 destinations 2-5% faster from 128 MiB).
#define FERROCCL_STREAMING_MIN (4ull << 20)

// A plain copy of `packs` 16-byte packs to every output (no operator, no scalar): four loads
// in flight per thread before the stores, so that each thread keeps more reads outstanding
// while its stores drain. Each pack is still read and written by one thread only.
static __device__ __forceinline__ void fan_out(const FoldParams& p, u64 start, u64 stride, u64 packs, bool streaming) {
    const Vec16* src = (const Vec16*)p.in[0];
    u64 j = start;
    for (; j + 3 * stride < packs; j += 4 * stride) {
        Vec16 v[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) v[u] = src[j + u * stride];
#pragma unroll
        for (int u = 0; u < 4; ++u) store16((Vec16*)p.out + j + u * stride, v[u], streaming);
        for (u64 m = 0; m < p.n_more; ++m) {
#pragma unroll
            for (int u = 0; u < 4; ++u) store16((Vec16*)p.more_out[m] + j + u * stride, v[u], streaming);
        }
    }
    for (; j < packs; j += stride) {
        Vec16 v = src[j];
        store16((Vec16*)p.out + j, v, streaming);
        for (u64 m = 0; m < p.n_more; ++m) store16((Vec16*)p.more_out[m] + j, v, streaming);
    }
}

// The grouped plain copy (see FoldParams::groups): per pack index, the groups' loads four at a
// time, then their stores; a store onto its own source (an in-place all-gather's own block) is
// skipped.
static __device__ __forceinline__ void fan_out_groups(const FoldParams& p, u64 start, u64 stride, u64 packs) {
    const bool streaming = packs * 16 >= FERROCCL_STREAMING_MIN;
    for (u64 j = start; j < packs; j += stride) {
        for (u64 g0 = 0; g0 < p.groups; g0 += 4) {
            const u64 n = p.groups - g0 < 4 ? p.groups - g0 : 4;
            Vec16 v[4];
#pragma unroll
            for (u64 u = 0; u < 4; ++u)
                if (u < n) v[u] = ((const Vec16*)p.in[g0 + u])[j];
#pragma unroll
            for (u64 u = 0; u < 4; ++u) {
                if (u >= n) break;
                const Vec16* src = (const Vec16*)p.in[g0 + u] + j;
                const u64 off = (g0 + u) * p.group_bytes;
                Vec16* o = (Vec16*)((char*)p.out + off) + j;
                if (o != src) store16(o, v[u], streaming);
                for (u64 m = 0; m < p.n_more; ++m) {
                    Vec16* d = (Vec16*)((char*)p.more_out[m] + off) + j;
                    if (d != src) store16(d, v[u], streaming);
                }
            }
        }
    }
}

// One 16-byte pack of the result: pack j of every input, each at byte offset `off`, folded.
template <typename T, int OP>
static __device__ __forceinline__ Vec16 fold_pack(const FoldParams& p, const typename T::S* scal, u64 off, u64 j) {
    const int E = 16 / sizeof(typename T::S);
    Pack<T> acc;
    acc.v = ((const Vec16*)((const char*)p.in[0] + off))[j];
    if (p.pre_mask & 1u) {
#pragma unroll
        for (int e = 0; e < E; ++e) acc.e[e] = T::mul(acc.e[e], scal[0]);
    }
    for (int k = 1; k < p.n_in; ++k) {
        Pack<T> x;
        x.v = ((const Vec16*)((const char*)p.in[k] + off))[j];
        if ((p.pre_mask >> k) & 1u) {
#pragma unroll
            for (int e = 0; e < E; ++e) x.e[e] = T::mul(x.e[e], scal[k]);
        }
#pragma unroll
        for (int e = 0; e < E; ++e) acc.e[e] = apply<T, OP>(acc.e[e], x.e[e]);
    }
    if (p.post_div != 0) {
#pragma unroll
        for (int e = 0; e < E; ++e) acc.e[e] = T::div(acc.e[e], p.post_div);
    }
    return acc.v;
}

// A grouped fold (FoldParams::groups with several inputs, a reduce-scatter): group g folds
// every input at offset g * group_bytes into out (g = 0) or more_out[g - 1].
template <typename T, int OP>
static __device__ __forceinline__ void fold_groups(const FoldParams& p, const typename T::S* scal, u64 start, u64 stride,
                                                   u64 packs) {
    const bool streaming = packs * 16 >= FERROCCL_STREAMING_MIN;
    for (u64 g = 0; g < p.groups; ++g) {
        Vec16* out = (Vec16*)(g == 0 ? p.out : p.more_out[g - 1]);
        const u64 off = g * p.group_bytes;
        for (u64 j = start; j < packs; j += stride) store16(out + j, fold_pack<T, OP>(p, scal, off, j), streaming);
    }
}

template <typename T, int OP>
static __device__ __forceinline__ void fold(const FoldParams& p) {
    typedef typename T::S S;
    const int E = 16 / sizeof(S);
    S scal[FERROCCL_MAX_INPUTS];
    for (int k = 0; k < p.n_in; ++k) {
        S s = (S)p.pre_bits[k];
        if (((p.pre_mask >> k) & 1u) && p.pre_ptr[k] != 0) s = *(const S*)p.pre_ptr[k];
        scal[k] = s;
    }
    const u64 start = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    const u64 stride = (u64)gridDim.x * blockDim.x;
    if (p.groups > 1) {
        if (p.n_in == 1 && p.pre_mask == 0 && p.post_div == 0) {
            fan_out_groups(p, start, stride, p.count / E);
        } else {
            fold_groups<T, OP>(p, scal, start, stride, p.count / E);
        }
        return;
    }

    // 16-byte loads and stores when every pointer is 16-byte aligned.
    u64 misaligned = (u64)p.out;
    for (int k = 0; k < p.n_in; ++k) misaligned |= (u64)p.in[k];
    for (u64 m = 0; m < p.n_more; ++m) misaligned |= (u64)p.more_out[m];
    u64 head = 0;
    if ((misaligned & 15u) == 0) {
        const u64 packs = p.count / E;
        const bool streaming = packs * 16 >= FERROCCL_STREAMING_MIN;
        const bool plain_copy = p.n_in == 1 && p.pre_mask == 0 && p.post_div == 0;
        if (plain_copy) fan_out(p, start, stride, packs, streaming);
        for (u64 j = plain_copy ? packs : start; j < packs; j += stride) {
            const Vec16 v = fold_pack<T, OP>(p, scal, 0, j);
            store16((Vec16*)p.out + j, v, streaming);
            for (u64 m = 0; m < p.n_more; ++m) store16((Vec16*)p.more_out[m] + j, v, streaming);
        }
        head = packs * E;
    }
    for (u64 i = head + start; i < p.count; i += stride) fold_one<T, OP>(p, scal, i);
}

// Several folds of one (type, operator) in one launch, for a group of small operations whose
// launches would otherwise cost more than their work: blockIdx.y picks the fold, which runs as
// its own launch would on gridDim.x blocks. The caller batches only folds that read no byte
// another one writes; two may write the same bytes only if identical and neither reads what it
// writes. Must match `FoldBatch` in kernels.rs (3984 bytes: kernel parameters are limited to
// 4 KiB).
#define FERROCCL_BATCH_MAX 7
struct FoldBatch {
    FoldParams ops[FERROCCL_BATCH_MAX];
    u64 n_ops;
};

// Each FERROCCL_FOLD line defines two entry points: ferroccl_fold_<t>_<op> (one fold) and
// ferroccl_batch_<t>_<op> (a FoldBatch).
#define FERROCCL_FOLD(t, T, op, OP) \
    extern "C" __global__ void __launch_bounds__(256) ferroccl_fold_##t##_##op(const FoldParams p) { fold<T, OP>(p); } \
    extern "C" __global__ void __launch_bounds__(256) ferroccl_batch_##t##_##op(const FoldBatch b) { \
        if (blockIdx.y < b.n_ops) fold<T, OP>(b.ops[blockIdx.y]); \
    }

// The 48 folds, 96 entry points (kernels.rs parses these lines; keep one per line). kernels.rs builds
// one program per type (-DFERROCCL_ONE_TYPE -DFERROCCL_TYPE_<t>) so that the types compile in
// parallel and a collective only waits for its own type.
#if !defined(FERROCCL_ONE_TYPE) || defined(FERROCCL_TYPE_i8)
FERROCCL_FOLD(i8, I8, sum, OP_SUM)
FERROCCL_FOLD(i8, I8, prod, OP_PROD)
FERROCCL_FOLD(i8, I8, max, OP_MAX)
FERROCCL_FOLD(i8, I8, min, OP_MIN)
#endif
#if !defined(FERROCCL_ONE_TYPE) || defined(FERROCCL_TYPE_u8)
FERROCCL_FOLD(u8, U8, sum, OP_SUM)
FERROCCL_FOLD(u8, U8, prod, OP_PROD)
FERROCCL_FOLD(u8, U8, max, OP_MAX)
FERROCCL_FOLD(u8, U8, min, OP_MIN)
#endif
#if !defined(FERROCCL_ONE_TYPE) || defined(FERROCCL_TYPE_i32)
FERROCCL_FOLD(i32, I32, sum, OP_SUM)
FERROCCL_FOLD(i32, I32, prod, OP_PROD)
FERROCCL_FOLD(i32, I32, max, OP_MAX)
FERROCCL_FOLD(i32, I32, min, OP_MIN)
#endif
#if !defined(FERROCCL_ONE_TYPE) || defined(FERROCCL_TYPE_u32)
FERROCCL_FOLD(u32, U32, sum, OP_SUM)
FERROCCL_FOLD(u32, U32, prod, OP_PROD)
FERROCCL_FOLD(u32, U32, max, OP_MAX)
FERROCCL_FOLD(u32, U32, min, OP_MIN)
#endif
#if !defined(FERROCCL_ONE_TYPE) || defined(FERROCCL_TYPE_i64)
FERROCCL_FOLD(i64, I64, sum, OP_SUM)
FERROCCL_FOLD(i64, I64, prod, OP_PROD)
FERROCCL_FOLD(i64, I64, max, OP_MAX)
FERROCCL_FOLD(i64, I64, min, OP_MIN)
#endif
#if !defined(FERROCCL_ONE_TYPE) || defined(FERROCCL_TYPE_u64)
FERROCCL_FOLD(u64, U64, sum, OP_SUM)
FERROCCL_FOLD(u64, U64, prod, OP_PROD)
FERROCCL_FOLD(u64, U64, max, OP_MAX)
FERROCCL_FOLD(u64, U64, min, OP_MIN)
#endif
#if !defined(FERROCCL_ONE_TYPE) || defined(FERROCCL_TYPE_f16)
FERROCCL_FOLD(f16, F16, sum, OP_SUM)
FERROCCL_FOLD(f16, F16, prod, OP_PROD)
FERROCCL_FOLD(f16, F16, max, OP_MAX)
FERROCCL_FOLD(f16, F16, min, OP_MIN)
#endif
#if !defined(FERROCCL_ONE_TYPE) || defined(FERROCCL_TYPE_f32)
FERROCCL_FOLD(f32, F32, sum, OP_SUM)
FERROCCL_FOLD(f32, F32, prod, OP_PROD)
FERROCCL_FOLD(f32, F32, max, OP_MAX)
FERROCCL_FOLD(f32, F32, min, OP_MIN)
#endif
#if !defined(FERROCCL_ONE_TYPE) || defined(FERROCCL_TYPE_f64)
FERROCCL_FOLD(f64, F64, sum, OP_SUM)
FERROCCL_FOLD(f64, F64, prod, OP_PROD)
FERROCCL_FOLD(f64, F64, max, OP_MAX)
FERROCCL_FOLD(f64, F64, min, OP_MIN)
#endif
#if !defined(FERROCCL_ONE_TYPE) || defined(FERROCCL_TYPE_bf16)
FERROCCL_FOLD(bf16, BF16, sum, OP_SUM)
FERROCCL_FOLD(bf16, BF16, prod, OP_PROD)
FERROCCL_FOLD(bf16, BF16, max, OP_MAX)
FERROCCL_FOLD(bf16, BF16, min, OP_MIN)
#endif
#if !defined(FERROCCL_ONE_TYPE) || defined(FERROCCL_TYPE_e4m3)
FERROCCL_FOLD(e4m3, E4M3, sum, OP_SUM)
FERROCCL_FOLD(e4m3, E4M3, prod, OP_PROD)
FERROCCL_FOLD(e4m3, E4M3, max, OP_MAX)
FERROCCL_FOLD(e4m3, E4M3, min, OP_MIN)
#endif
#if !defined(FERROCCL_ONE_TYPE) || defined(FERROCCL_TYPE_e5m2)
FERROCCL_FOLD(e5m2, E5M2, sum, OP_SUM)
FERROCCL_FOLD(e5m2, E5M2, prod, OP_PROD)
FERROCCL_FOLD(e5m2, E5M2, max, OP_MAX)
FERROCCL_FOLD(e5m2, E5M2, min, OP_MIN)
#endif
