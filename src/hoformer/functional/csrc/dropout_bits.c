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

/* words [w0, w1) of the mask of n elements applied to x, written to y (x == y allowed: each output reads only its
 * own input element) */
#define DROPOUT_BITS(NAME, T)                                                                            \
    CLONES void NAME(const T *x, T *y, int64_t n, uint64_t seed, uint32_t t, T scale, int64_t w0,         \
                     int64_t w1) {                                                                        \
        int64_t h = (n + 1) / 2, both = n - h; /* words j < both have two elements, word h - 1 may have one */ \
        int64_t end = w1 < both ? w1 : both;                                                              \
        for (int64_t j = w0; j < end; j++) {                                                              \
            uint64_t z = mix(seed + (uint64_t)(j + 1) * GAMMA);                                           \
            y[j] = (uint32_t)z >= t ? x[j] * scale : (T)0;                                                \
            y[h + j] = (uint32_t)(z >> 32) >= t ? x[h + j] * scale : (T)0;                                \
        }                                                                                                 \
        for (int64_t j = end > w0 ? end : w0; j < w1; j++) {                                              \
            uint64_t z = mix(seed + (uint64_t)(j + 1) * GAMMA);                                           \
            y[j] = (uint32_t)z >= t ? x[j] * scale : (T)0;                                                \
        }                                                                                                 \
    }

DROPOUT_BITS(hoformer_dropout_bits_f32, float)
DROPOUT_BITS(hoformer_dropout_bits_f64, double)
