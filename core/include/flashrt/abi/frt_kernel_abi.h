/* flashrt kernel package ABI: the only header shared by the core and kernel packages.
 *
 * Plain C99, fixed-width types. A kernel package is one shared library per build variant that
 * exports two symbols:
 *   frt_kpkg_query(frt_kpkg_info*)   what the library was compiled for. Lives in an object built
 *                                    without ISA flags so calling it can never SIGILL.
 *   frt_kpkg_open(abi_major)         the const function table, or NULL if abi_major differs.
 * Every table function returns an int32_t status and fills a caller-owned frt_error. Nothing
 * allocated crosses the boundary and no C++ exception escapes it. Minor ABI bumps only append
 * members; the loader checks struct_size before reading one.
 */
#ifndef FLASHRT_ABI_FRT_KERNEL_ABI_H
#define FLASHRT_ABI_FRT_KERNEL_ABI_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* 2.0: a package lists the ops it owns (frt_op) and answers supports_op() at plan time, instead
 * of one wide table every package filled with nulls (1.x).
 * 3.0: group scales may be fp16, int4 groups carry a min (W = q*scale + min) instead of a zero
 * point, and int8 has a group form: the layouts GGUF's Q8_0/Q4_0/Q4_1 blocks map onto exactly.
 * 3.1: FRT_W_INT4_GEMM, int4 groups laid out for integer dot products (a format appended).
 * 4.0: frt_attention_args carries the cache's strides, so a cache can hold each KV head's
 * positions contiguously (a caller of 3.x passed a smaller struct: a major bump), and
 * FRT_W_INT4_GEMM holds a column's two nibbles of a byte four inputs apart, so one 64-byte
 * load is sixteen columns' worth of eight inputs (Note [W4A8]).
 * 4.1: FRT_OP_MOE_FFN, a routed bank of gated experts (frt_moe_args); frt_op_desc gains the
 * bank's expert count and top-k (appended).
 * 4.2: FRT_OP_CAPPED_ATTENTION, attention whose scores are softcapped (Gemma 2), a kind of its
 *   own so that no caller of 4.1 hands a package a struct shorter than it reads.
 * 4.3: FRT_OP_GATED_DELTA (the gated delta rule, frt_gated_delta_args) and FRT_OP_CAUSAL_CONV1D
 *   (a depthwise causal convolution with its state, frt_causal_conv1d_args): kinds appended.
 * 4.4: FRT_W_INT4_SUPER, int4 in super-blocks of 256 with 6-bit sub-block scale and min codes
 *   under f16 super scales (GGUF Q4_K's own values), and FRT_W_INT8_SUPER, int8 in groups of 16
 *   with int8 scale codes under an f16 super scale (GGUF Q6_K's): formats appended.
 * 4.5: FRT_W_INT4_SUPER_GEMM, FRT_W_INT6_SUPER_GEMM, FRT_W_INT5_GEMM and
 *   FRT_W_INT5_SUPER_GEMM: GGUF Q4_K's, Q6_K's, Q5_0/Q5_1's and Q5_K's values laid out for the
 *   integer dot products of FRT_W_INT4_GEMM (formats appended).
 * 4.6: FRT_OP_GATED_ACT, the gated activation act(gate) * up elementwise (frt_gated_act_args):
 *   a kind appended.
 * 4.7: FRT_OP_PAGED_ATTENTION, a batch of decode rows against keys and values in a shared pool
 *   of slots, f32 or bf16, each row's positions named by a slot table (frt_paged_attention_args):
 *   a kind appended.
 * 4.8: FRT_OP_CACHE_ATTENTION, attention (softcapped or not) over a cache of f32 or bf16
 *   (frt_cache_attention_args): a kind appended, the earlier attention structs unchanged.
 * 4.9: FRT_OP_SEQUENCE_ATTENTION, every query of a sequence against every key of a sequence,
 *   bf16, unmasked (frt_sequence_attention_args): a kind appended. */
#define FRT_KERNEL_ABI_MAJOR 4
#define FRT_KERNEL_ABI_MINOR 9

/* IEEE half to single, exactly (scales stored as FRT_F16 mean this value on both sides). */
static inline float frt_f16_to_f32(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu, bits;
  union {
    uint32_t u;
    float f;
  } v;
  if (exp == 0x1fu) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112u) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else { /* subnormal: normalise */
    exp = 113;
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      --exp;
    }
    bits = sign | (exp << 23) | ((mant & 0x3ffu) << 13);
  }
  v.u = bits;
  return v.f;
}

/* Width of one weight panel: every packed format stores output channels in panels of this many
 * columns, so one packed buffer serves every variant (generic, avx2, avx512vnni). */
#define FRT_PANEL 16

/* FRT_W_INT4_SUPER: inputs per super-block, groups in one, and the bytes of one panel's record
 * of a super-block (d and dmin in f16, then the eight scale and eight min codes, a byte each). */
#define FRT_SUPER_K 256
#define FRT_SUPER4_GROUPS 8
#define FRT_SUPER4_RECORD (FRT_PANEL * (2 + 2 + 2 * FRT_SUPER4_GROUPS))
#define FRT_SUPER4_DMIN_AT (2 * FRT_PANEL) /* byte offsets in a record */
#define FRT_SUPER4_SC_AT (4 * FRT_PANEL)
#define FRT_SUPER4_M_AT (FRT_SUPER4_SC_AT + FRT_SUPER4_GROUPS * FRT_PANEL)
/* FRT_W_INT8_SUPER: groups in a super-block, and one panel's record of it (d in f16, then the
 * sixteen groups' int8 scale codes). */
#define FRT_SUPER8_GROUPS 16
#define FRT_SUPER8_RECORD (FRT_PANEL * (2 + FRT_SUPER8_GROUPS))
#define FRT_SUPER8_SC_AT (2 * FRT_PANEL)
/* FRT_W_INT6_SUPER_GEMM's bytes per panel and block of 32 inputs: nibbles, then two planes;
 * FRT_W_INT5_GEMM's and FRT_W_INT5_SUPER_GEMM's: nibbles, then one plane. */
#define FRT_INT5_BLOCK (FRT_PANEL * 32 * 5 / 8)
#define FRT_INT6_BLOCK (FRT_PANEL * 32 * 6 / 8)
#define FRT_INT6_PLANES_AT (FRT_PANEL * 16)

enum frt_status { FRT_OK = 0, FRT_E_INVALID = 1, FRT_E_UNSUPPORTED = 2, FRT_E_INTERNAL = 3 };

typedef struct frt_error {
  int32_t code; /* frt_status */
  char message[256];
} frt_error;

/* f16 only as a scale dtype of the group formats; activations are f32 or bf16. */
enum frt_dtype { FRT_F32 = 0, FRT_BF16 = 1, FRT_F16 = 2 };

/* gelu is the exact (erf) form; gelu_tanh the tanh approximation. */
enum frt_act { FRT_ACT_SILU = 0, FRT_ACT_GELU_TANH = 1, FRT_ACT_GELU = 2 };

/* The ops a package may own. A package lists only its own (frt_kernel_table.ops). */
enum frt_op_kind {
  FRT_OP_LINEAR = 1,             /* frt_linear_args */
  FRT_OP_GATED_FFN = 2,          /* frt_ffn_args: down(act(gate(x)) * up(x)) */
  FRT_OP_FFN = 3,                /* frt_ffn_args, gate NULL: down(act(up(x) + b_up)) + b_down */
  FRT_OP_RMSNORM = 4,            /* frt_rmsnorm_args */
  FRT_OP_ROTARY = 5,             /* frt_rotary_args */
  FRT_OP_ATTENTION = 6,          /* frt_attention_args */
  FRT_OP_DENSE = 7,              /* frt_dense_args */
  FRT_OP_MOE_FFN = 8,            /* frt_moe_args (4.1) */
  FRT_OP_CAPPED_ATTENTION = 9,   /* frt_capped_attention_args (4.2) */
  FRT_OP_GATED_DELTA = 10,       /* frt_gated_delta_args (4.3) */
  FRT_OP_CAUSAL_CONV1D = 11,     /* frt_causal_conv1d_args (4.3) */
  FRT_OP_GATED_ACT = 12,         /* frt_gated_act_args (4.6) */
  FRT_OP_PAGED_ATTENTION = 13,   /* frt_paged_attention_args (4.7) */
  FRT_OP_CACHE_ATTENTION = 14,   /* frt_cache_attention_args (4.8) */
  FRT_OP_SEQUENCE_ATTENTION = 15 /* frt_sequence_attention_args (4.9) */
};

/* ---- The weight formats (the format header). -----------------------------------------------
 * Weight W is [n][k] (torch's Linear.weight layout), y = x W^T.
 * P = ceil(n / FRT_PANEL) panels; column j of panel p is output channel p*FRT_PANEL + j; columns
 * past n are padding with zero scale.
 *
 * FRT_W_INT8_CHANNEL: qdata int8 [P][k][FRT_PANEL]; scales f32 [P*FRT_PANEL];
 *   W[c][i] = q * scales[c].
 * FRT_W_INT8_GROUP: group size g in {16, 32, 64, 128}, k % g == 0; qdata int8 [P][k][FRT_PANEL];
 *   scales [P][k/g][FRT_PANEL] in scale_dtype;  W[c][i] = q * scale.      (GGUF Q8_0 at g = 32,
 *   Q6_K at g = 16 with f32 scales d * sc; packages before flashrt/linear 2.1, flashrt/ffn 2.2
 *   and flashrt/decode 2.1 refuse g = 16)
 * FRT_W_INT4_GROUP: group size g in {32, 64, 128}, k % g == 0; nibbles q in [0, 15];
 *   qdata uint8 [P][k/2][FRT_PANEL], byte = q(c, 2r) | q(c, 2r+1) << 4;
 *   scales, mins [P][k/g][FRT_PANEL] in scale_dtype;  W[c][i] = q * scale + min.
 *   Symmetric packs have min == -8 * scale (GGUF Q4_0); asymmetric ones any min (Q4_1).
 * FRT_W_INT4_SUPER (4.4): GGUF Q4_K's values at their stored precision. group == 32, k % 256 == 0;
 *   nibbles as FRT_W_INT4_GROUP (qdata uint8 [P][k/2][FRT_PANEL]); scales points to [P][k/256]
 *   super records of FRT_SUPER4_RECORD bytes: d f16 [FRT_PANEL], dmin f16 [FRT_PANEL], then
 *   sc uint8 [8][FRT_PANEL] and m uint8 [8][FRT_PANEL], codes 0..63 for the eight groups of 32
 *   in the super-block; mins is NULL; scale_dtype is FRT_F16 (the dtype of d and dmin).
 *   With s = f32(d) * sc and o = f32(dmin) * m (both exact in f32): W[c][i] = q * s - o.
 *   4.625 bits a weight (the file's 4.5, its 6-bit codes held in bytes).
 * FRT_W_INT8_SUPER (4.4): GGUF Q6_K's values at their stored precision. group == 16,
 *   k % 256 == 0; qdata int8 [P][k][FRT_PANEL] as FRT_W_INT8_GROUP (Q6_K's values are -32..31);
 *   scales points to [P][k/256] super records of FRT_SUPER8_RECORD bytes: d f16 [FRT_PANEL],
 *   then sc int8 [16][FRT_PANEL], the sixteen groups' scale codes; mins is NULL; scale_dtype is
 *   FRT_F16. With s = f32(d) * sc (exact in f32): W[c][i] = q * s. 8.5625 bits a weight (the
 *   file's 6.5625, its 6-bit values held in bytes).
 * scale_dtype is FRT_F32 or FRT_F16 for the group formats and FRT_F32 for per-channel int8.
 */
/* FRT_W_INT8_GEMM: the w8a8 GEMM's layout (flashrt/gemm); symmetric int8 per output channel,
 *   q in [-127, 127], kq = ceil(k / 4):
 *   qdata int8 [P][kq][FRT_PANEL][4]: W[c][4t + j] at [c / FRT_PANEL][t][c % FRT_PANEL][j], zero
 *   past k; scales f32 [P*FRT_PANEL]; mins f32 [P*FRT_PANEL] hold the column sums
 *   sum_i q(c, i) (exact integers), which remove the activations' zero point.
 *   W[c][i] = q * scales[c].
 *   Ops over this format quantize each activation row at run time (Note [W8A8 rows]):
 *   lo = min(min(x), 0), hi = max(max(x), 0), s = (hi - lo) / 127 (1 when 0), inv = 1 / s,
 *   z = nearbyint(-lo * inv), u = clamp(nearbyint(x * inv) + z, 0, 127); a row holding inf or
 *   NaN gets every output NaN. Seven bits, so AVX2's vpmaddubsw, which sums two u8 x s8
 *   products in int16, never saturates (2 * 127 * 127 < 32767).
 *   With group == 32 (the decode form; group is 0 otherwise) each block of 32 inputs of a row
 *   is quantized on its own, symmetric: amax = max |x|, d = amax / 127, inv = 127 / amax (0 when
 *   amax is 0), a = clamp(nearbyint(x * inv), -127, 127); y[c] = scales[c] * sum over blocks of
 *   float(sum_i a_i q(c, i)) * d, accumulated block by block in fp32 (Note [W8A8 blocks]).
 * FRT_W_INT4_GEMM: int4 in groups of 32 inputs (group == 32, k % 32 == 0) for the same integer
 *   dot products, activations per block of 32 as in the decode form above; q in [0, 15]:
 *   qdata uint8 [P][k/8][FRT_PANEL][4]: byte b of column j in oct o holds W[16p + j][8o + b] in
 *   its low nibble and W[16p + j][8o + 4 + b] in its high nibble (4.0; 3.1 paired columns j and
 *   j + 8 in a byte instead); scales f16 [P][k/32][FRT_PANEL]; mins f16
 *   [P][k/32][FRT_PANEL], W = q * scale + min, or NULL for a symmetric pack, W = (q - 8) * scale.
 *   With s_a = sum_i a_i over a block: y[c] = sum over blocks, in fp32, of
 *   float(sum_i a_i q - 8 s_a) * (scale * d)                 (symmetric), or
 *   float(sum_i a_i q) * (scale * d) + min * (d * float(s_a))   (with mins; Note [W4A8]).
 * FRT_W_INT4_SUPER_GEMM (4.5): GGUF Q4_K's values for the same integer dot products. group ==
 *   32, k % 256 == 0; nibbles as FRT_W_INT4_GEMM (qdata uint8 [P][k/8][FRT_PANEL][4]); scales
 *   points to FRT_W_INT4_SUPER's super records ([P][k/256] of FRT_SUPER4_RECORD bytes); mins is
 *   NULL; scale_dtype FRT_F16. Each group of 32 is an activation block, with scale = f32(d) * sc
 *   and min = -(f32(dmin) * m) (both exact in f32) in the with-mins sum above.
 * FRT_W_INT6_SUPER_GEMM (4.5): GGUF Q6_K's values for the same integer dot products, at the
 *   file's 6.5625 bits a weight. group == 16, k % 256 == 0; u = q + 32 in [0, 63];
 *   qdata uint8 [P][k/32][FRT_INT6_BLOCK]: per panel and block of 32 inputs, bytes 0..255 the
 *   low nibbles of u laid out as FRT_W_INT4_GEMM's four octs (byte 64t + 4j + l: column j's
 *   inputs 8t + l (low nibble) and 8t + 4 + l (high)), then two planes of 64 bytes holding the
 *   top two bits (u >> 4): in byte 4j + l of the first plane bits 2t..2t+1 are input 8t + l's,
 *   in the second input 8t + 4 + l's; scales points to FRT_W_INT8_SUPER's records ([P][k/256]
 *   of FRT_SUPER8_RECORD bytes), mins is NULL, scale_dtype FRT_F16. W = (u - 32) * s with
 *   s = f32(d) * sc (exact in f32); block b's inputs 0..15 are group 2 (b % 8), 16..31 group
 *   2 (b % 8) + 1 of super-block b / 8. With h_a the sum of a block's first 16 activations:
 *   y[c] = sum over blocks, in fp32, of float(sum_{i < 16} a_i u_i - 32 h_a) * (s_0 * d) then
 *   float(sum_{i >= 16} a_i u_i - 32 (s_a - h_a)) * (s_1 * d).
 * FRT_W_INT5_GEMM (4.5): GGUF Q5_0's and Q5_1's values for the same integer dot products.
 *   group == 32, k % 32 == 0; u in [0, 31]; qdata uint8 [P][k/32][FRT_INT5_BLOCK]: per panel and
 *   block of 32 inputs, bytes 0..255 the low nibbles of u as FRT_W_INT6_SUPER_GEMM's, then one
 *   plane of 64 bytes: in byte 4j + l bit t is the fifth bit (u >> 4) of column j's input
 *   8t + l and bit 4 + t that of input 8t + 4 + l (t = 0..3); scales and mins f16
 *   [P][k/32][FRT_PANEL] as FRT_W_INT4_GEMM's, mins NULL for a symmetric pack: W = (u - 16) * s
 *   (Q5_0), else W = u * s + min (Q5_1); the sums as FRT_W_INT4_GEMM's with 16 for 8.
 * FRT_W_INT5_SUPER_GEMM (4.5): GGUF Q5_K's values: group == 32, k % 256 == 0; qdata as
 *   FRT_W_INT5_GEMM's, scales pointing to FRT_W_INT4_SUPER's records, mins NULL:
 *   W = u * (f32(d) * sc) - f32(dmin) * m, summed as FRT_W_INT4_SUPER_GEMM's.
 * Numbered past the small values so formats appended later do not collide. */
enum frt_wformat {
  FRT_W_INT8_CHANNEL = 1,
  FRT_W_INT4_GROUP = 2,
  FRT_W_INT8_GROUP = 3,
  FRT_W_INT4_SUPER = 4, /* 4.4 */
  FRT_W_INT8_SUPER = 5, /* 4.4 */
  FRT_W_INT8_GEMM = 16,
  FRT_W_INT4_GEMM = 17,
  FRT_W_INT4_SUPER_GEMM = 18, /* 4.5 */
  FRT_W_INT6_SUPER_GEMM = 19, /* 4.5 */
  FRT_W_INT5_GEMM = 20,       /* 4.5 */
  FRT_W_INT5_SUPER_GEMM = 21  /* 4.5 */
};

typedef struct frt_packed_weight {
  int32_t format;      /* frt_wformat */
  int32_t group;       /* group size; 0 for int8 per-channel */
  int32_t scale_dtype; /* frt_dtype of scales and mins */
  int32_t reserved;
  int64_t n, k;
  const void* qdata;
  const void* scales;
  const void* mins; /* int4 only */
} frt_packed_weight;

/* y[m][n] = sum_k x[m][k] W[n][k] (+ bias[n]). Rows are strided (ldx, ldy in elements), the
 * inner dimension is contiguous. */
typedef struct frt_linear_args {
  int32_t x_dtype, y_dtype; /* frt_dtype */
  int64_t m;
  const void* x;
  int64_t ldx;
  void* y;
  int64_t ldy;
  const float* bias; /* [n] or NULL */
  const frt_packed_weight* w;
  void* workspace; /* linear_workspace() bytes, 64-byte aligned, owned by the caller */
} frt_linear_args;

/* FRT_OP_GATED_FFN: y = down(act(gate(x)) * up(x)), bias-free.
 * FRT_OP_FFN:       y = down(act(up(x) + up_bias)) + down_bias, gate NULL, biases optional.
 * All weights in one format. */
typedef struct frt_ffn_args {
  int32_t x_dtype, y_dtype;
  int32_t act; /* frt_act */
  int64_t m;
  const void* x;
  int64_t ldx;
  void* y;
  int64_t ldy;
  const frt_packed_weight *gate, *up, *down;
  const float *up_bias, *down_bias; /* fp32 [up.n] / [down.n] or NULL */
  void* workspace;                  /* the op's workspace() bytes */
} frt_ffn_args;

/* FRT_OP_MOE_FFN: a bank of `experts` gated experts, each down_e(act(gate_e(x)) * up_e(x)) as in
 * FRT_OP_GATED_FFN, and the rows routed to them. Row r goes to the experts index[r][0..top_k)
 * with the weights weight[r][0..top_k):
 *   y[r] = sum_j weight[r][j] * down_e(act(gate_e(x[r])) * up_e(x[r])),   e = index[r][j].
 * gate, up and down point at `experts` packed weights each (gate_e, up_e [inner x k], down_e
 * [n x inner]), all in one format. A selected expert's weights are read once per call, however
 * many rows chose it. Each y[r] sums its terms in ascending expert order (a repeated expert in
 * ascending j), so the result does not depend on the thread split. supports() refuses an index
 * outside [0, experts), a weight that is not finite, top_k outside 1..FRT_MAX_TOP_K: the caller
 * runs its own path then. */
#define FRT_MAX_TOP_K 32
typedef struct frt_moe_args {
  int32_t x_dtype, y_dtype;
  int32_t act;   /* frt_act: silu or gelu_tanh */
  int32_t top_k; /* experts per row */
  int64_t m;     /* rows, 1..FRT_MAX_ROWS */
  const void* x;
  int64_t ldx;
  void* y;
  int64_t ldy;
  const int64_t* index; /* [m][top_k], row stride top_k */
  const float* weight;  /* [m][top_k], row stride top_k */
  int64_t experts;
  const frt_packed_weight *gate, *up, *down; /* [experts] each */
  void* workspace;                           /* the op's workspace() bytes */
} frt_moe_args;

/* Reasons supports() can give; the message names the form and the shape. */
enum frt_reason {
  FRT_REASON_OK = 0,
  FRT_REASON_ROWS_OUT_OF_BAND = 1,
  FRT_REASON_FORMAT = 2,
  FRT_REASON_SHAPE = 3,
  FRT_REASON_DTYPE = 4,
  FRT_REASON_LAYOUT = 5,
  FRT_REASON_NOT_PROVIDED = 6
};

/* Decode rows every package qualifies for. */
#define FRT_MAX_ROWS 16

/* ---- Decode-step primitives (flashrt/decode). Activations are fp32. ------------------------ */

/* y[r] = x[r] / sqrt(mean(x[r]^2) + eps) * weight, for `rows` rows of `width`. */
typedef struct frt_rmsnorm_args {
  int64_t rows, width;
  const float* x;
  int64_t ldx;
  const float* weight; /* [width] */
  float eps;
  float* y; /* may alias x */
  int64_t ldy;
} frt_rmsnorm_args;

/* Rotates `heads` vectors of head_dim in place, pairing element i with i + head_dim/2:
 * (a, b) -> (a cos_i - b sin_i, b cos_i + a sin_i). */
typedef struct frt_rotary_args {
  int64_t heads, head_dim;
  float* x;               /* [heads][head_dim] */
  const float *cos, *sin; /* [head_dim / 2] */
} frt_rotary_args;

/* FRT_OP_GATED_ACT: out[i] = act(gate[i]) * up[i] for i < n (act an frt_act), elementwise, so
 * any split across threads gives the same values: the gated feed-forward's middle where a decode
 * program runs its projections apart. out may be gate or up. */
typedef struct frt_gated_act_args {
  int32_t act;
  int64_t n;
  const float *gate, *up;
  float* out;
} frt_gated_act_args;

/* One query token against `positions` cached keys/values with grouped heads (heads % kv_heads
 * == 0; head h reads kv head h / (heads / kv_heads)); softmax in fp32. The vector of position t,
 * KV head j starts at cache + t * ld_pos + j * ld_head (floats; head_dim contiguous). */
typedef struct frt_attention_args {
  int64_t heads, kv_heads, head_dim, positions;
  const float* q;       /* [heads][head_dim] */
  const float* k_cache; /* see ld_pos, ld_head */
  const float* v_cache; /* same layout */
  float scale;
  float* out;    /* [heads][head_dim] */
  float* scores; /* [heads][scores_stride], scores_stride >= positions */
  int64_t scores_stride;
  int64_t ld_pos, ld_head; /* >= head_dim: [positions][kv_heads][head_dim] has ld_pos = kv_heads *
                            * head_dim, ld_head = head_dim; [kv_heads][max_len][head_dim] has
                            * ld_pos = head_dim, ld_head = max_len * head_dim */
} frt_attention_args;

/* FRT_OP_CAPPED_ATTENTION: as FRT_OP_ATTENTION with each score s (already times scale) replaced by
 * softcap * tanh(s / softcap) before the softmax; softcap > 0. */
typedef struct frt_capped_attention_args {
  frt_attention_args attention;
  float softcap;
} frt_capped_attention_args;

/* FRT_OP_CACHE_ATTENTION (4.8): FRT_OP_ATTENTION (softcap > 0: FRT_OP_CAPPED_ATTENTION's scores)
 * over a cache whose elements are cache_dtype, FRT_F32 or FRT_BF16, each widened to f32 as it
 * loads; k_cache, v_cache, ld_pos and ld_head as FRT_OP_ATTENTION's, counted in those elements.
 * A kind of its own: the structs of FRT_OP_ATTENTION and FRT_OP_CAPPED_ATTENTION stay 4.7's. */
typedef struct frt_cache_attention_args {
  int64_t heads, kv_heads, head_dim, positions;
  int32_t cache_dtype; /* frt_dtype */
  const float* q;      /* [heads][head_dim] */
  const void *k_cache, *v_cache;
  int64_t ld_pos, ld_head;
  float scale, softcap; /* softcap 0: none */
  float* out;           /* [heads][head_dim] */
  float* scores;        /* [heads][scores_stride], scores_stride >= positions */
  int64_t scores_stride;
} frt_cache_attention_args;

/* FRT_OP_SEQUENCE_ATTENTION (4.9): out = softmax(scale * q k^T) v for every query of each of
 * `batch` sequences against every key of its key sequence: no mask, no causality (a DiT's self-
 * and cross-attention, an encoder's). Grouped heads as FRT_OP_ATTENTION's. q, k, v and out hold
 * dtype elements (FRT_BF16), head_dim contiguous; query t of head h in sequence b starts at
 * q + b * q_ld[0] + t * q_ld[1] + h * q_ld[2] elements, and likewise k and v (kv heads, kv_len
 * positions) and out (q_len, heads). Scores and the softmax in fp32; the probabilities may be
 * rounded to the dtype before they weight v (the tile path's, Note [Sequence attention]). */
typedef struct frt_sequence_attention_args {
  int64_t batch, heads, kv_heads, head_dim, q_len, kv_len;
  int32_t dtype; /* frt_dtype */
  int32_t reserved;
  const void* q;
  int64_t q_ld[3]; /* sequence, position, head */
  const void* k;
  int64_t k_ld[3];
  const void* v;
  int64_t v_ld[3];
  void* out;
  int64_t out_ld[3];
  float scale;
  int32_t reserved2;
  void* workspace; /* the op's workspace() bytes */
} frt_sequence_attention_args;

/* FRT_OP_PAGED_ATTENTION: one query token for each of `batch` rows against the keys and values
 * a serving engine keeps in one pool of slots for every sequence (SGLang's token-to-KV pool).
 * Row b attends lengths[b] positions; its position t is slot table[rows[b] * ld_table + t] of
 * the pool, and the vector of slot s, KV head j starts at pool + s * ld_slot + j * ld_head
 * elements of cache_dtype (FRT_F32 or FRT_BF16, head_dim contiguous). Grouped heads and the
 * softmax as FRT_OP_ATTENTION (softcap > 0: the scores capped first). q and out are f32
 * [batch][heads][head_dim], ld_q / ld_out apart; scores is scratch of [batch][heads][scores_stride]
 * floats, scores_stride >= every length. A line outside [0, table_lines), a length outside
 * [1, table_width] or a slot outside [0, slots) is an error; the thread whose item names it
 * returns before reading it (the others may have written theirs). */
typedef struct frt_paged_attention_args {
  int64_t batch, heads, kv_heads, head_dim;
  int32_t cache_dtype; /* frt_dtype */
  const float* q;
  int64_t ld_q;
  const void *k_pool, *v_pool;
  int64_t slots, ld_slot, ld_head;
  const int32_t* table; /* [table_lines][ld_table] slot indices, table_width of them in use */
  int64_t table_lines, table_width, ld_table;
  const int64_t* rows;    /* [batch]: each row's line of the table */
  const int64_t* lengths; /* [batch] */
  float scale, softcap;
  float* out;
  int64_t ld_out;
  float* scores;
  int64_t scores_stride;
} frt_paged_attention_args;

/* y = x W^T (+ bias) with the host's own row-major weight W [n][k] (fp32 or bf16), x fp32. */
typedef struct frt_dense_args {
  int32_t w_dtype; /* frt_dtype */
  int64_t m, n, k;
  const float* x;
  int64_t ldx;
  const void* w;
  int64_t ldw;
  const float* bias;
  float* y;
  int64_t ldy;
} frt_dense_args;

/* ---- Recurrences (flashrt/recurrent, 4.3): the state lives with the caller. ---------------- */

/* FRT_OP_GATED_DELTA: the gated delta rule over `tokens` positions of `batch` sequences. Value
 * head h reads key head h / (v_heads / k_heads) (v_heads % k_heads == 0). With q and k first
 * l2-normalised when `l2norm` is set (x / sqrt(sum x^2 + l2_eps), in fp32) and q then multiplied
 * by `scale`, per sequence, value head and token t in order:
 *   S <- exp(g_t) S;   d = beta_t (v_t - S^T k_t);   S <- S + k_t d^T;   o_t = S^T q_t
 * S is [k_dim][v_dim] fp32, starting from initial_state (NULL: zeros) and left in final_state
 * (may equal initial_state). Element i of the vector of (sequence b, token t, head j) of q is at
 * q + b*q_ld[0] + t*q_ld[1] + j*q_ld[2] + i*q_inc (elements of x_dtype; q_inc 0 reads as 1; k and
 * v likewise: a host's convolution output may hand them channel-strided); g (fp32) and
 * beta (beta_dtype) of (b, t, value head j) at b*ld[0] + t*ld[1] + j; the states are contiguous
 * [batch][v_heads][k_dim][v_dim]; out is contiguous [batch][tokens][v_heads][v_dim] in x_dtype. */
typedef struct frt_gated_delta_args {
  int64_t batch, tokens, k_heads, v_heads, k_dim, v_dim;
  int32_t x_dtype;    /* FRT_F32 or FRT_BF16: q, k, v and out */
  int32_t beta_dtype; /* FRT_F32 or FRT_BF16 */
  int32_t l2norm;     /* nonzero: l2-normalise q and k */
  float l2_eps, scale;
  int32_t reserved;
  const void *q, *k, *v;
  int64_t q_ld[3], k_ld[3], v_ld[3];
  const float* g;
  int64_t g_ld[2];
  const void* beta;
  int64_t beta_ld[2];
  const float* initial_state;
  float* final_state;
  void* out;
  int64_t q_inc, k_inc, v_inc; /* element strides of a head's vector; 0 or 1: contiguous */
} frt_gated_delta_args;

/* FRT_OP_CAUSAL_CONV1D: a depthwise causal convolution of `kernel` taps over `channels` channels,
 * `tokens` new positions per sequence. Per sequence and channel c, with w = the `state_len`
 * positions of the state (zeros when state is NULL; state_len >= kernel - 1) followed by x:
 *   y[t] = act(bias[c] + sum_{j < kernel} weight[c][j] * w[state_len + t - (kernel - 1) + j])
 * in fp32, and then, when state is not NULL, the state becomes the last state_len positions of w.
 * Element (b, c, t) of x is at x + b*x_ld[0] + c*x_ld[1] + t*x_ld[2] (y, state likewise), all in
 * `dtype`; weight is contiguous [channels][kernel], bias [channels] or NULL. */
typedef struct frt_causal_conv1d_args {
  int64_t batch, channels, tokens, kernel;
  int32_t dtype; /* FRT_F32 or FRT_BF16: x, weight, bias, state and y */
  int32_t act;   /* FRT_ACT_SILU, or -1: none */
  const void* x;
  int64_t x_ld[3];
  const void* weight;
  const void* bias;
  void* state;
  int64_t state_len;
  int64_t state_ld[3];
  void* y;
  int64_t y_ld[3];
} frt_causal_conv1d_args;

/* A form described at plan time, before any tensor exists: asked once per seat through
 * supports_op(). Fields an op does not use are 0. FRT_OP_GATED_DELTA (4.3): x_dtype, k = k_dim,
 * n = v_dim. FRT_OP_CAUSAL_CONV1D (4.3): x_dtype, n = channels, k = taps, act = FRT_ACT_SILU or
 * -1 (none). */
typedef struct frt_op_desc {
  int32_t op;      /* frt_op_kind */
  int32_t wformat; /* frt_wformat of the packed weights */
  int32_t group;   /* group size of the group formats */
  int32_t act;     /* frt_act (ffn ops) */
  int32_t x_dtype, y_dtype;
  int32_t has_bias;
  int64_t rows_max;    /* the band's upper end: the most rows one call will bring */
  int64_t n, k;        /* output and input widths */
  int64_t inner;       /* intermediate width (ffn ops) */
  int32_t scale_dtype; /* frt_dtype of the weights' scales */
  int32_t reserved;
  int64_t experts; /* expert banks (FRT_OP_MOE_FFN, 4.1): experts in the bank */
  int32_t top_k;   /* experts each row is routed to */
  int32_t reserved2;
} frt_op_desc;

/* One op a package owns. `args` points at the struct its kind names. An op runs as `phases`
 * phases; the caller runs phase p on nth threads (ith = 0..nth-1) and waits for all of them
 * before phase p+1. Kernels keep no state between calls. */
typedef struct frt_op {
  int32_t kind;   /* frt_op_kind */
  int32_t phases; /* >= 1 */
  /* Per call: FRT_REASON_OK or the reason, the message naming form and shape. */
  int32_t (*supports)(const void* args, frt_error* err);
  int64_t (*workspace)(const void* args); /* bytes; NULL = none */
  int32_t (*run)(const void* args, int32_t phase, int32_t ith, int32_t nth, frt_error* err);
} frt_op;

typedef struct frt_kernel_table {
  int32_t abi_major, abi_minor, struct_size;
  const char* package; /* "flashrt/linear" */
  const char* isa;     /* "generic", "avx2", "avx512vnni" */
  /* Plan time: whether this package runs the described form; returns frt_reason and names the
   * form in err. A kind the package does not own is FRT_REASON_NOT_PROVIDED. */
  int32_t (*supports_op)(const frt_op_desc* desc, frt_error* err);
  int32_t n_ops;
  const frt_op* ops; /* n_ops entries, one per kind */
} frt_kernel_table;

typedef struct frt_kpkg_info {
  int32_t abi_major, abi_minor;
  const char* arch;     /* "x86_64" */
  const char* isa;      /* the variant's ISA tier */
  const char* features; /* comma-separated CPU features the build was compiled for */
} frt_kpkg_info;

#if defined(_WIN32)
#define FRT_KPKG_EXPORT __declspec(dllexport)
#else
#define FRT_KPKG_EXPORT __attribute__((visibility("default")))
#endif

typedef int32_t (*frt_kpkg_query_fn)(frt_kpkg_info* out);
typedef const frt_kernel_table* (*frt_kpkg_open_fn)(int32_t abi_major);

#ifdef __cplusplus
}
#endif
#endif /* FLASHRT_ABI_FRT_KERNEL_ABI_H */
