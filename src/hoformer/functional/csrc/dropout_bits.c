/* hoformer's dropout mask, fused with its use: y = x * m, m[i] = scale if the element is kept, else 0.
 *
 * The random bits are a counter-based stream (SplitMix64, Steele, Lea & Flood 2014: the word of counter j is
 * mix(seed + (j + 1) * GAMMA)), so any range of it is computed independently: the same mask on any number of
 * threads, and the backward pass recomputes the mask from the seed instead of storing it.
 * Element j < h (h = ceil(n / 2)) reads the low 32 bits of word j, element h + j its high 32 bits; an element is
 * kept iff its 32 bits, as an unsigned integer, are >= t = round(p * 2^32) (probability 1 - t / 2^32).
 * hoformer.functional.dropout_bits holds the same definition in torch operations (the portable path and the
 * reference the tests compare with). This file is compiled at first use (no Python headers: called with ctypes). */
#include <stdint.h>
#include <string.h>

#define GAMMA 0x9E3779B97F4A7C15ULL

static inline uint64_t mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

#if defined(__x86_64__) && defined(HOFORMER_CLONES)
#define CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define CLONES
#endif

/* bfloat16 (the bits as uint16) to and from float: rounded to nearest even as torch's bfloat16 (c10::BFloat16)
 * rounds, NaN to 0x7FC0 */
static inline float bf16_f32(uint16_t x) {
    uint32_t u = (uint32_t)x << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint16_t f32_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u)
        return 0x7FC0;
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

/* x * scale in the storage type T: a plain product for float and double; for bfloat16 the product of the widened
 * values rounded once, torch's bfloat16 product (scale: the mask's value in bfloat16, widened, what the torch path
 * multiplies by), so both paths give the same bits */
#define SCALED(x, scale) ((x) * (scale))
#define SCALED_BF16(x, scale) f32_bf16(bf16_f32(x) * (scale))

/* words [w0, w1) of the mask of n elements applied to x, written to y (x == y allowed: each output reads only its
 * own input element); T the storage type, S the scale's */
#define DROPOUT_BITS(NAME, T, S, MUL)                                                                    \
    CLONES void NAME(const T *x, T *y, int64_t n, uint64_t seed, uint32_t t, S scale, int64_t w0,         \
                     int64_t w1) {                                                                        \
        int64_t h = (n + 1) / 2, both = n - h; /* words j < both have two elements, word h - 1 may have one */ \
        int64_t end = w1 < both ? w1 : both;                                                              \
        for (int64_t j = w0; j < end; j++) {                                                              \
            uint64_t z = mix(seed + (uint64_t)(j + 1) * GAMMA);                                           \
            y[j] = (uint32_t)z >= t ? MUL(x[j], scale) : (T)0;                                            \
            y[h + j] = (uint32_t)(z >> 32) >= t ? MUL(x[h + j], scale) : (T)0;                            \
        }                                                                                                 \
        for (int64_t j = end > w0 ? end : w0; j < w1; j++) {                                              \
            uint64_t z = mix(seed + (uint64_t)(j + 1) * GAMMA);                                           \
            y[j] = (uint32_t)z >= t ? MUL(x[j], scale) : (T)0;                                            \
        }                                                                                                 \
    }

DROPOUT_BITS(hoformer_dropout_bits_f32, float, float, SCALED)
DROPOUT_BITS(hoformer_dropout_bits_f64, double, double, SCALED)
DROPOUT_BITS(hoformer_dropout_bits_bf16, uint16_t, float, SCALED_BF16)

/* ---------------------------------------------------------------------------------------------------------------
 * The MLP's hidden activation in one pass: y = m * gelu(h + b) for h (rows, N) and the bias b (N), m the mask of the
 * dropout above (the same words, elements and threshold) times its scale, and with it d = m * gelu'(h + b), all the
 * backward pass needs: gh = g * d and the bias gradient's column sums of gh, in one pass too.
 * gelu(v) = v / 2 * (1 + erf(v / sqrt 2)) (the exact, erf form), gelu'(v) = (1 + erf(v / sqrt 2)) / 2 + v phi(v);
 * 1 + erf(u) is 2 - erfc(u) for u >= 0 and erfc(-u) otherwise, erfc(z) = t P(t) e^(-z^2), t = 1 / (1 + p z)
 * (Abramowitz & Stegun 7.1.26, absolute error below 1.5e-7, the approximation of ATen's vectorised float erf),
 * e^x by Cody-Waite reduction and Cephes' degree-6 polynomial: branch-free float arithmetic that the compiler
 * vectorises. Float32 and bfloat16 storage (bfloat16 rounded to nearest even), float32 arithmetic in both; other dtypes
 * take torch's operations. */

static inline float exp_neg(float x) { /* e^x for x <= 88; 0 below -87 */
    float xc = x < -87.0f ? -87.0f : x;
    float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* round to nearest */
    float r = xc - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    int32_t bits = ((int32_t)n + 127) << 23;
    float s;
    memcpy(&s, &bits, sizeof s);
    return x < -87.0f ? 0.0f : p * s;
}

#define SQRT1_2 0.70710678118654752f
#define INV_SQRT_2PI 0.39894228040143268f
#define TILE 256

/* gelu(v) and gelu'(v) */
static inline void gelu2(float v, float *y, float *d) {
    float u = v * SQRT1_2, z = u < 0.0f ? -u : u;
    float t = 1.0f / (1.0f + 0.3275911f * z);
    float q = -1.453152027f + t * 1.061405429f;
    q = 1.421413741f + t * q;
    q = -0.284496736f + t * q;
    q = 0.254829592f + t * q;
    float gauss = exp_neg(-z * z); /* e^(-v^2 / 2) */
    float e = t * q * gauss;       /* erfc(z) */
    float cdf2 = u >= 0.0f ? 2.0f - e : e; /* 1 + erf(u) */
    *y = 0.5f * v * cdf2;
    *d = 0.5f * cdf2 + v * INV_SQRT_2PI * gauss;
}

/* the keep bits of words [a, a + m): lo[k] the low half of word a + k, hi[k] its high half */
static inline void tile_bits(uint64_t seed, int64_t a, int64_t m, uint32_t *lo, uint32_t *hi) {
    for (int64_t k = 0; k < m; k++) {
        uint64_t z = mix(seed + (uint64_t)(a + k + 1) * GAMMA);
        lo[k] = (uint32_t)z;
        hi[k] = (uint32_t)(z >> 32);
    }
}

/* elements [e0, e0 + len) of the (rows, N) tensors, their keep bits bits[0..len); LOAD / STORE convert the storage
 * type T (float, or bfloat16 as uint16) to and from float: the arithmetic is float32 in both */
#define LOAD_F32(v) (v)
#define STORE_F32(v) (v)
#define LOAD_BF16(v) bf16_f32(v)
#define STORE_BF16(v) f32_bf16(v)
#define SEGMENT(NAME, T, LOAD, STORE)                                                                             \
    static inline void NAME(const T *restrict h, const float *restrict b, T *restrict y, T *restrict d,          \
                            const uint32_t *restrict bits, int64_t e0, int64_t len, int64_t N, uint32_t t,        \
                            float scale) {                                                                        \
        int64_t c = e0 % N;                                                                                       \
        for (int64_t k = 0; k < len;) {                                                                           \
            int64_t m = N - c < len - k ? N - c : len - k;                                                        \
            const T *hs = h + e0 + k;                                                                             \
            const float *bs = b + c;                                                                              \
            const uint32_t *ks = bits + k;                                                                        \
            T *ys = y + e0 + k, *ds = d + e0 + k;                                                                 \
            for (int64_t i = 0; i < m; i++) {                                                                     \
                float g, dg, s = ks[i] >= t ? scale : 0.0f;                                                       \
                gelu2(LOAD(hs[i]) + bs[i], &g, &dg);                                                              \
                ys[i] = STORE(g * s);                                                                             \
                ds[i] = STORE(dg * s);                                                                            \
            }                                                                                                     \
            k += m;                                                                                               \
            c = 0;                                                                                                \
        }                                                                                                         \
    }

/* words [w0, w1) of the n = rows * N elements: y and d (h, y, d of type T, the bias float32) */
#define BIAS_GELU_DROPOUT(NAME, SEG, T)                                                                           \
    CLONES void NAME(const T *h, const float *b, T *y, T *d, int64_t n, int64_t N, uint64_t seed, uint32_t t,     \
                     float scale, int64_t w0, int64_t w1) {                                                       \
        uint32_t lo[TILE], hi[TILE];                                                                              \
        int64_t half = (n + 1) / 2, both = n - half;                                                              \
        for (int64_t a = w0; a < w1; a += TILE) {                                                                 \
            int64_t m = w1 - a < TILE ? w1 - a : TILE;                                                            \
            int64_t m_hi = a >= both ? 0 : (both - a < m ? both - a : m);                                         \
            tile_bits(seed, a, m, lo, hi);                                                                        \
            SEG(h, b, y, d, lo, a, m, N, t, scale);                                                               \
            SEG(h, b, y, d, hi, half + a, m_hi, N, t, scale);                                                     \
        }                                                                                                         \
    }

/* elements [e0, e1) of the backward pass: gh = g * d, gb[c] += gh over the rows (a double per column) */
#define BIAS_GELU_DROPOUT_BACKWARD(NAME, T, LOAD, STORE)                                                          \
    CLONES void NAME(const T *restrict g, const T *restrict d, T *restrict gh, double *restrict gb, int64_t N,     \
                     int64_t e0, int64_t e1) {                                                                    \
        int64_t c = e0 % N;                                                                                       \
        for (int64_t e = e0; e < e1;) {                                                                           \
            int64_t m = N - c < e1 - e ? N - c : e1 - e;                                                          \
            for (int64_t i = 0; i < m; i++) {                                                                     \
                T r = STORE(LOAD(g[e + i]) * LOAD(d[e + i]));                                                     \
                gh[e + i] = r;                                                                                    \
                gb[c + i] += (double)LOAD(r);                                                                     \
            }                                                                                                     \
            e += m;                                                                                               \
            c = 0;                                                                                                \
        }                                                                                                         \
    }

SEGMENT(segment_f32, float, LOAD_F32, STORE_F32)
SEGMENT(segment_bf16, uint16_t, LOAD_BF16, STORE_BF16)
BIAS_GELU_DROPOUT(hoformer_bias_gelu_dropout_f32, segment_f32, float)
BIAS_GELU_DROPOUT(hoformer_bias_gelu_dropout_bf16, segment_bf16, uint16_t)
BIAS_GELU_DROPOUT_BACKWARD(hoformer_bias_gelu_dropout_backward_f32, float, LOAD_F32, STORE_F32)
BIAS_GELU_DROPOUT_BACKWARD(hoformer_bias_gelu_dropout_backward_bf16, uint16_t, LOAD_BF16, STORE_BF16)
