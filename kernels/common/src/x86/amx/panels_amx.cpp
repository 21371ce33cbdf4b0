// The amx variant's tile path for the int8 and int4 weight-only panels but int8 groups of 16 and
// the int8 super-blocks (Note [Tile panels]); every other panel, and these at fewer rows, are the
// avx512vnni variant's (select_amx.cpp).
#include <frt_kern/amx_tiles.h>
#include <frt_kern/panels.h>
#include <frt_kern/zmm.h>
#include <frt_kern/zmm_scales.h>

namespace frt::kern {

// Note [Tile panels]: at one to eight rows a weight-only panel is a stream of weights, but at
// sixteen its FMAs bound it (int8 here; int4 the same with its nibbles): each 16 weights widened
// feed two blocks of eight rows, 20 vector operations per 32 weights of a row pair, ~10 cycles on
// the two FMA ports, while the weights arrive from DRAM in ~5
// (bench/results/amx/panel_blocks_of_eight.json: 114 GMAC/s on two cores at 16 rows, the FMA ports'
// ceiling). AMX-BF16 takes the products off those ports:
//   - an int8 weight is exact in bf16, and an fp32 activation of magnitude >= 2^-103 is exactly
//     the sum of three bf16 parts (hi the top 16 bits, mid the top 16 bits of x - hi, lo what is
//     left: 8 + 8 + 8 significant bits; truncation, so each difference is exact; below 2^-103 a
//     part is denormal, and the tiles read it as zero: an error under 2^-126 |w| a product). A
//     bf16 activation is its own hi. Every product of a part and a weight is exact in fp32, so
//     the sums are fp32 sums of the exact products, as the FMA panels' are, in another order
//     (other bits, the same accuracy).
//   - prepare_rows() writes the parts once per call in tile order (split_rows_amx): part s,
//     32-input step t is one 16 x 64-byte A tile, the row's 32 bf16 in input order.
//   - per step the panel's packed rows (32 of int8, 16 of int4) are widened into one B tile:
//     tdpbf16ps pairs A[m][2j], A[m][2j+1] with word pair j of each column, so B row j holds, per
//     column, input 2j in the low word and 2j+1 in the high one (an int4 row is that pair
//     already). Widened to fp32 the integers have zero low halves, so the pair is one shift and
//     one or. int4 levels (0..15) are exact in bf16 too; the group's min enters through the
//     row's group sum, as in the FMA panels.
//   - three C tiles take the products in turn (part s of a group's step t into
//     C[(s + t % 2) % 3]): one C would chain each tdpbf16ps on the last one's result. A group's
//     C tiles are summed ((C0 + C1) + C2) and scaled into the row's result as the FMA panels do
//     (apply_group's order), so int4_super and its exact re-expression as int4 g32 keep the same
//     bits here too.
// A row's sums depend on its own parts only (a tile row is its own dot products), so a row has
// the same bits at any row count on this path; the op takes it from tile_from_amx(w) rows up,
// where it measured faster than the FMA blocks.

namespace {

constexpr int kCTiles = 0, kATiles = 3, kBTiles = 6;  // C 0..2, A 3..5 (the parts), B 6..7
constexpr int64_t kStep = 32;                         // inputs per tile step

amx::TileConfig tile_config(int64_t m) {
  amx::TileConfig c;
  for (int t = 0; t < 8; ++t) {
    c.rows[t] = static_cast<uint8_t>(t >= kBTiles ? 16 : m);
    c.colsb[t] = 64;
  }
  return c;
}

// Sixteen fp32 as their bf16 top halves, stored.
inline void store_top_halves(uint16_t* out, __m512i bits) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out),
                      _mm512_cvtepi32_epi16(_mm512_srli_epi32(bits, 16)));
}

// B tile j of a step: columns' pairs (input 2j low, 2j + 1 high) of the step's 32 packed rows.
inline void widen_step(const int8_t* rows, uint16_t (*b)[32]) {
  for (int j = 0; j < 16; ++j) {
    const int8_t* pair = rows + 2 * j * FRT_PANEL;
    const __m512i even = _mm512_castps_si512(_mm512_cvtepi32_ps(
        _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(pair)))));
    const __m512i odd = _mm512_castps_si512(_mm512_cvtepi32_ps(
        _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(pair + FRT_PANEL)))));
    _mm512_store_si512(reinterpret_cast<__m512i*>(b[j]),
                       _mm512_or_si512(odd, _mm512_srli_epi32(even, 16)));
  }
}

// The same from an int4 panel: packed row j of the step holds inputs 2j (low nibbles) and 2j + 1
// (high nibbles) of its 16 columns, already the pair a B row takes.
inline void widen_step_int4(const uint8_t* rows, uint16_t (*b)[32]) {
  for (int j = 0; j < 16; ++j) {
    const __m512i v =
        _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rows + j * 16)));
    const __m512i even =
        _mm512_castps_si512(_mm512_cvtepi32_ps(_mm512_and_si512(v, _mm512_set1_epi32(0x0f))));
    const __m512i odd = _mm512_castps_si512(_mm512_cvtepi32_ps(_mm512_srli_epi32(v, 4)));
    _mm512_store_si512(reinterpret_cast<__m512i*>(b[j]),
                       _mm512_or_si512(odd, _mm512_srli_epi32(even, 16)));
  }
}

// A panel's packed steps: int8 (32 rows of 16 bytes a step) or int4 (16 rows of 16 bytes).
struct Int8Steps {
  const int8_t* q;
  void widen(int64_t t, uint16_t (*b)[32]) const { widen_step(q + t * kStep * FRT_PANEL, b); }
};
struct Int4Steps {
  const uint8_t* q;
  void widen(int64_t t, uint16_t (*b)[32]) const {
    widen_step_int4(q + t * (kStep / 2) * FRT_PANEL, b);
  }
};

template <int S, int Parity>
inline void product(const uint16_t* parts, int64_t steps, int64_t t) {
  amx::load<kATiles + S>(parts + (S * steps + t) * 16 * kStep, 64);
  amx::dpbf16ps<kCTiles + (S + Parity) % 3, kATiles + S, kBTiles + Parity>();
}

template <int Parity, typename Steps>
inline void step(const Steps& q, const uint16_t* parts, int32_t nparts, int64_t steps, int64_t t,
                 uint16_t (*b)[32]) {
  q.widen(t, b);
  amx::load<kBTiles + Parity>(b, 64);
  product<0, Parity>(parts, steps, t);
  if (nparts > 1) {
    product<1, Parity>(parts, steps, t);
    product<2, Parity>(parts, steps, t);
  }
}

// The products of inputs [t0, t1) steps into the zeroed C tiles, out as one sum per row.
template <typename Steps>
inline void group_sums(const Steps& q, const uint16_t* parts, int32_t nparts, int64_t steps,
                       int64_t t0, int64_t t1, float (*c)[16][16]) {
  amx::zero<kCTiles>();
  amx::zero<kCTiles + 1>();
  amx::zero<kCTiles + 2>();
  alignas(64) uint16_t b[2][16][32];
  int64_t t = t0;
  for (; t + 2 <= t1; t += 2) {
    step<0>(q, parts, nparts, steps, t, b[0]);
    step<1>(q, parts, nparts, steps, t + 1, b[1]);
  }
  if (t < t1) step<0>(q, parts, nparts, steps, t, b[0]);
  amx::store<kCTiles>(c[0], 64);
  amx::store<kCTiles + 1>(c[1], 64);
  amx::store<kCTiles + 2>(c[2], 64);
}

inline __m512 row_sum(const float (*c)[16][16], int64_t r) {
  return _mm512_add_ps(_mm512_add_ps(_mm512_load_ps(c[0][r]), _mm512_load_ps(c[1][r])),
                       _mm512_load_ps(c[2][r]));
}

}  // namespace

// From how many rows each form takes the tiles (0: never), measured on the Xeon against the FMA
// panels with the weights streaming from DRAM, 2048 x 8192: per channel from 5 rows (5 rows ran
// 0.77x the FMA panels' time, 4 rows 1.2x slower on tiles); the group forms from 9, where the
// FMA panels leave their block of eight. In runs with every form on tiles from 5 rows (not kept:
// panel_tiles.json is the run after), 8 rows ran 1.03-1.19x slower on tiles for int8 g64 and int4
// g32; panel_tiles.json has 9 rows at 0.97x (int8 g64) and 0.92x (int4 g32), 10 at 0.89x / 0.87x.
int64_t tile_from_amx(const frt_packed_weight* w) {
  if (w->k % kStep != 0) return 0;
  if (w->format == FRT_W_INT8_CHANNEL) return 5;
  const bool group = w->format == FRT_W_INT8_GROUP || w->format == FRT_W_INT4_GROUP ||
                     w->format == FRT_W_INT4_SUPER;
  return group && w->group % kStep == 0 ? 9 : 0;
}

void split_rows_amx(const float* x, int64_t ldx, int64_t k, int64_t r0, int64_t r1, int32_t nparts,
                    uint16_t* parts) {
  const int64_t steps = k / kStep;
  const __m512i top = _mm512_set1_epi32(static_cast<int32_t>(0xffff0000u));
  const __m512i exponent = _mm512_set1_epi32(0x7f800000);
  const __m512i magnitude = _mm512_set1_epi32(0x7fffffff);
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t t = 0; t < steps; ++t)
      for (int h = 0; h < 2; ++h) {
        const __m512i bits = _mm512_castps_si512(_mm512_loadu_ps(x + r * ldx + t * kStep + h * 16));
        // Infinity and NaN stay whole in hi (a NaN made quiet, so truncation keeps it a NaN).
        const __mmask16 finite = static_cast<__mmask16>(
            ~_mm512_cmpeq_epi32_mask(_mm512_and_si512(bits, exponent), exponent));
        const __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(bits, magnitude), exponent);
        const __m512i truncated = _mm512_and_si512(bits, top);
        const __m512i hi =
            _mm512_mask_or_epi32(truncated, nan, truncated, _mm512_set1_epi32(0x00400000));
        uint16_t* at = parts + (t * 16 + r) * kStep + h * 16;
        store_top_halves(at, hi);
        if (nparts == 1) continue;
        const __m512 rest1 =
            _mm512_maskz_sub_ps(finite, _mm512_castsi512_ps(bits), _mm512_castsi512_ps(hi));
        const __m512i mid = _mm512_and_si512(_mm512_castps_si512(rest1), top);
        const __m512 rest2 = _mm512_sub_ps(rest1, _mm512_castsi512_ps(mid));
        store_top_halves(at + steps * 16 * kStep, mid);
        store_top_halves(at + 2 * steps * 16 * kStep, _mm512_castps_si512(rest2));
      }
}

namespace {

// The group panels: each group's C tiles summed, then into the row's result as the FMA panels
// apply a group (res += s * sum, and for int4 first res += mn * the row's group sum).
template <bool kMins, typename Steps, typename Scales>
void group_panel(const frt_packed_weight* w, const Steps& q, const Scales& sc,
                 const uint16_t* parts, int32_t nparts, const float* xsum, int64_t m, float* out) {
  const int64_t steps = w->k / kStep, groups = w->k / w->group, per_group = w->group / kStep;
  alignas(64) float c[3][16][16];
  for (int64_t r = 0; r < m; ++r) _mm512_storeu_ps(out + r * FRT_PANEL, _mm512_setzero_ps());
  for (int64_t g = 0; g < groups; ++g) {
    group_sums(q, parts, nparts, steps, g * per_group, (g + 1) * per_group, c);
    for (int64_t r = 0; r < m; ++r) {
      const __m512 res = _mm512_loadu_ps(out + r * FRT_PANEL);
      if constexpr (kMins)
        _mm512_storeu_ps(out + r * FRT_PANEL,
                         apply_group(sc, g, xsum[r * groups + g], row_sum(c, r), res));
      else
        _mm512_storeu_ps(out + r * FRT_PANEL, _mm512_fmadd_ps(sc.scale(g), row_sum(c, r), res));
    }
  }
}

}  // namespace

void tiles_amx(const frt_packed_weight* w, int64_t p, const uint16_t* parts, int32_t nparts,
               const float* xsum, int64_t m, float* out) {
  const int64_t k = w->k;
  const Int8Steps q8{static_cast<const int8_t*>(w->qdata) + p * k * FRT_PANEL};
  const Int4Steps q4{static_cast<const uint8_t*>(w->qdata) + p * (k / 2) * FRT_PANEL};
  // Per channel, w->group is 0: groups only for the group forms.
  const StoredScales stored{w, w->group > 0 ? p * (k / w->group) * FRT_PANEL : 0};
  amx::configure(tile_config(m));
  if (w->format == FRT_W_INT8_CHANNEL) {
    alignas(64) float c[3][16][16];
    group_sums(q8, parts, nparts, k / kStep, 0, k / kStep, c);
    const __m512 scale = _mm512_loadu_ps(static_cast<const float*>(w->scales) + p * FRT_PANEL);
    for (int64_t r = 0; r < m; ++r)
      _mm512_storeu_ps(out + r * FRT_PANEL, _mm512_mul_ps(row_sum(c, r), scale));
  } else if (w->format == FRT_W_INT8_GROUP) {
    group_panel<false>(w, q8, stored, parts, nparts, xsum, m, out);
  } else if (w->format == FRT_W_INT4_GROUP) {
    group_panel<true>(w, q4, stored, parts, nparts, xsum, m, out);
  } else {  // FRT_W_INT4_SUPER
    const SuperScales super{static_cast<const uint8_t*>(w->scales) +
                            p * (k / FRT_SUPER_K) * FRT_SUPER4_RECORD};
    group_panel<true>(w, q4, super, parts, nparts, xsum, m, out);
  }
  amx::release();
}

}  // namespace frt::kern
