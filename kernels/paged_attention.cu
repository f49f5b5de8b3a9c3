// pagesim: paged-attention decode kernels, the paged prefill kernel, the KV-cache write and the
// block copy.
//
// Reimplemented from the ideas of vLLM's csrc/attention and the seed article's outline:
// one thread block per (sequence, up to 4 query heads of one KV group) [v1] or per (those
// heads, sequence, partition) [v2, split-K], so a GQA group reads each K/V row once; the
// block table read inside the loop, keys and values read in place
// from key_cache/value_cache of shape (num_blocks, block_size, num_kv_heads, head_dim),
// an online softmax in fp32, and slots past the context never read.
//
// Built by NVRTC (through CuPy) at run time and by nvcc in the compile checks. It uses
// no headers at all: NVRTC has no host headers (and no INFINITY), and half/bfloat16
// values are widened with one PTX instruction or a shift instead of cuda_fp16.h.

namespace pagesim {

constexpr int WARP = 32;
constexpr int NUM_THREADS = 128;
constexpr int NUM_WARPS = NUM_THREADS / WARP;
constexpr int PARTITION_SIZE = 512;  // tokens per v2 partition (vLLM's choice)
constexpr int TOKENS_PER_ITER = 2;  // tokens each thread group loads before it uses any
constexpr unsigned FULL_MASK = 0xffffffffu;

// Storage kinds: 0 = float32, 1 = float16, 2 = bfloat16 (held as raw 16-bit patterns).
template <int KIND> struct Storage { typedef unsigned short type; };
template <> struct Storage<0> { typedef float type; };

__device__ __forceinline__ float negative_infinity() { return __int_as_float(0xff800000); }

// Widen one 16-bit pattern (low bits of `bits`) to fp32.
template <int KIND> __device__ __forceinline__ float widen16(unsigned int bits);
template <> __device__ __forceinline__ float widen16<1>(unsigned int bits) {
  float f;
  unsigned short h = static_cast<unsigned short>(bits & 0xffffu);
#ifdef PAGESIM_HOST_EMULATION  // the one host fallback: inline PTX has no CPU form
  f = pagesim_emulated_half_to_float(h);
#else
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
#endif
  return f;
}
template <> __device__ __forceinline__ float widen16<2>(unsigned int bits) {
  return __uint_as_float((bits & 0xffffu) << 16);
}

// Elements in one 16-byte vector load.
template <int KIND> struct Vec { static constexpr int N = 16 / sizeof(typename Storage<KIND>::type); };

// 16 bytes as loaded, widened to fp32 (held raw until used: half the registers for 16-bit kinds).
template <int KIND>
__device__ __forceinline__ void widen_vec(const uint4& v, float* out) {
  const unsigned int w[4] = {v.x, v.y, v.z, v.w};
  if constexpr (KIND == 0) {
#pragma unroll
    for (int i = 0; i < 4; ++i) out[i] = __uint_as_float(w[i]);
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      out[2 * i] = widen16<KIND>(w[i]);
      out[2 * i + 1] = widen16<KIND>(w[i] >> 16);
    }
  }
}

// One 16-byte coalesced load, as it comes.
template <int KIND> __device__ __forceinline__ uint4 load_raw(const typename Storage<KIND>::type* p) {
  const uint4 v = *reinterpret_cast<const uint4*>(p);
  return v;
}

// One 16-byte coalesced load, widened to fp32.
template <int KIND>
__device__ __forceinline__ void load_vec(const typename Storage<KIND>::type* p, float* out) {
  widen_vec<KIND>(load_raw<KIND>(p), out);
}

__host__ __device__ constexpr int next_pow2(int x) { return x <= 1 ? 1 : 2 * next_pow2((x + 1) / 2); }
__host__ __device__ constexpr int min_int(int a, int b) { return a < b ? a : b; }
__host__ __device__ constexpr int max_int(int a, int b) { return a > b ? a : b; }

// Thread-group geometry: a group of GROUP lanes reads one token's head slice with
// 16-byte loads, so a warp reads TOKENS_PER_WARP tokens at once.
template <int KIND, int HEAD_DIM> struct Geometry {
  static constexpr int VEC = Vec<KIND>::N;
  static constexpr int CHUNKS = HEAD_DIM / VEC;
  static constexpr int GROUP = min_int(WARP, next_pow2(CHUNKS));
  static constexpr int CHUNKS_PER_LANE = (CHUNKS + GROUP - 1) / GROUP;
  static constexpr int ELEMS = CHUNKS_PER_LANE * VEC;
  static constexpr int TOKENS_PER_WARP = WARP / GROUP;
  static_assert(HEAD_DIM % 8 == 0, "head_dim must be a multiple of 8");
  static_assert(HEAD_DIM <= 256, "head_dim must be at most 256");
};

// Merge two online-softmax states (max m, sum l, unnormalised accumulator acc).
template <int ELEMS>
__device__ __forceinline__ void merge_state(float& m, float& l, float* acc, float m_o, float l_o, const float* acc_o) {
  const float m_new = fmaxf(m, m_o);
  if (m_new == negative_infinity()) return;  // both empty
  const float a = __expf(m - m_new), b = __expf(m_o - m_new);
  l = l * a + l_o * b;
#pragma unroll
  for (int i = 0; i < ELEMS; ++i) acc[i] = acc[i] * a + acc_o[i] * b;
  m = m_new;
}

// Attend HEADS query heads of one KV group over tokens [token_begin, token_end) of one
// sequence: each K and V slice is loaded once and used for every head of the block.
// Head h's normalised output (HEAD_DIM floats) goes to out + h * out_stride and, if asked,
// its max and sum to out_max / out_sum + h * stat_stride.
template <int KIND, int HEAD_DIM, int BLOCK_SIZE, int HEADS>
__device__ void attend_range(float* __restrict__ out, float* __restrict__ out_max, float* __restrict__ out_sum,
                             long long out_stride, long long stat_stride,
                             const typename Storage<KIND>::type* __restrict__ q_ptr,
                             const typename Storage<KIND>::type* __restrict__ key_cache,
                             const typename Storage<KIND>::type* __restrict__ value_cache,
                             const int* __restrict__ block_table, int token_begin, int token_end, int block_size_rt,
                             int num_kv_heads, int kv_head, float scale) {
  typedef Geometry<KIND, HEAD_DIM> G;
  const int block_size = BLOCK_SIZE > 0 ? BLOCK_SIZE : block_size_rt;
  const int tid = threadIdx.x;
  const int warp = tid / WARP, lane = tid % WARP;
  const int group = lane / G::GROUP, lane_in_group = lane % G::GROUP;

  // This lane's slice of each head: chunks lane_in_group, lane_in_group + GROUP, ...
  // (the heads' queries are HEAD_DIM apart).
  float q[HEADS][G::ELEMS];
#pragma unroll
  for (int h = 0; h < HEADS; ++h) {
#pragma unroll
    for (int c = 0; c < G::CHUNKS_PER_LANE; ++c) {
      const int chunk = lane_in_group + c * G::GROUP;
      if (chunk < G::CHUNKS) {
        load_vec<KIND>(q_ptr + h * HEAD_DIM + chunk * G::VEC, q[h] + c * G::VEC);
#pragma unroll
        for (int i = 0; i < G::VEC; ++i) q[h][c * G::VEC + i] *= scale;
      } else {
#pragma unroll
        for (int i = 0; i < G::VEC; ++i) q[h][c * G::VEC + i] = 0.f;
      }
    }
  }

  float acc[HEADS][G::ELEMS];
  float m[HEADS], l[HEADS];
#pragma unroll
  for (int h = 0; h < HEADS; ++h) {
    m[h] = negative_infinity();
    l[h] = 0.f;
#pragma unroll
    for (int i = 0; i < G::ELEMS; ++i) acc[h][i] = 0.f;
  }
  const long long token_stride = static_cast<long long>(num_kv_heads) * HEAD_DIM;

  // Every lane of a warp runs the same iterations so the shuffles stay converged. An
  // iteration gives each thread group TOKENS_PER_ITER tokens (first + group + j·TOKENS_PER_WARP):
  // all their K and V loads are issued before any is used, and the online softmax rescales
  // once per batch, not once per token.
  constexpr int BATCH = TOKENS_PER_ITER;
  int cached_logical = -1;  // the block-table entry this lane read last
  long long cached_physical = 0;
  constexpr int WARP_SPAN = G::TOKENS_PER_WARP * BATCH;  // tokens a warp takes per iteration
  for (int first = token_begin + warp * WARP_SPAN; first < token_end; first += NUM_WARPS * WARP_SPAN) {
    uint4 k[BATCH][G::CHUNKS_PER_LANE], v[BATCH][G::CHUNKS_PER_LANE];  // raw 16-byte loads
    bool valid[BATCH];
#pragma unroll
    for (int j = 0; j < BATCH; ++j) {
      const int t = first + group + j * G::TOKENS_PER_WARP;
      valid[j] = t < token_end;
      long long base = 0;
      if (valid[j]) {
        // The block-table lookup: logical block -> physical block, read once per block a
        // lane visits (a lane's tokens run through each block in order), widened before the multiply.
        const int logical = t / block_size;
        if (logical != cached_logical) {
          cached_logical = logical;
          cached_physical = static_cast<long long>(block_table[logical]);
        }
        base = (cached_physical * block_size + t % block_size) * token_stride +
               static_cast<long long>(kv_head) * HEAD_DIM;
      }
#pragma unroll
      for (int c = 0; c < G::CHUNKS_PER_LANE; ++c) {
        const int chunk = lane_in_group + c * G::GROUP;
        if (valid[j] && chunk < G::CHUNKS) {
          k[j][c] = load_raw<KIND>(key_cache + base + chunk * G::VEC);
          v[j][c] = load_raw<KIND>(value_cache + base + chunk * G::VEC);
        } else {
          k[j][c].x = k[j][c].y = k[j][c].z = k[j][c].w = 0u;  // zero bits: 0.0 in every kind
          v[j][c] = k[j][c];
        }
      }
    }
    float s[HEADS][BATCH];
    float batch_max[HEADS];
#pragma unroll
    for (int h = 0; h < HEADS; ++h) batch_max[h] = negative_infinity();
#pragma unroll
    for (int j = 0; j < BATCH; ++j) {
#pragma unroll
      for (int h = 0; h < HEADS; ++h) s[h][j] = 0.f;
#pragma unroll
      for (int c = 0; c < G::CHUNKS_PER_LANE; ++c) {
        float kf[G::VEC];
        widen_vec<KIND>(k[j][c], kf);  // widened once, used by every head
#pragma unroll
        for (int h = 0; h < HEADS; ++h) {
#pragma unroll
          for (int i = 0; i < G::VEC; ++i) s[h][j] += q[h][c * G::VEC + i] * kf[i];
        }
      }
#pragma unroll
      for (int h = 0; h < HEADS; ++h) {
#pragma unroll
        for (int mask = G::GROUP / 2; mask > 0; mask /= 2) s[h][j] += __shfl_xor_sync(FULL_MASK, s[h][j], mask);
        if (valid[j]) batch_max[h] = fmaxf(batch_max[h], s[h][j]);  // after the shuffles: masked slots never count
      }
    }
    if (!valid[0]) continue;  // the batch's tokens are in order: none of them is in range

    float m_new[HEADS];
#pragma unroll
    for (int h = 0; h < HEADS; ++h) {
      m_new[h] = fmaxf(m[h], batch_max[h]);
      const float correction = __expf(m[h] - m_new[h]);  // 0 while m is still -inf
      l[h] *= correction;
#pragma unroll
      for (int i = 0; i < G::ELEMS; ++i) acc[h][i] *= correction;
    }
#pragma unroll
    for (int j = 0; j < BATCH; ++j) {
      if (!valid[j]) break;
      float p[HEADS];
#pragma unroll
      for (int h = 0; h < HEADS; ++h) {
        p[h] = __expf(s[h][j] - m_new[h]);
        l[h] += p[h];
      }
#pragma unroll
      for (int c = 0; c < G::CHUNKS_PER_LANE; ++c) {
        float vf[G::VEC];
        widen_vec<KIND>(v[j][c], vf);
#pragma unroll
        for (int h = 0; h < HEADS; ++h) {
#pragma unroll
          for (int i = 0; i < G::VEC; ++i) acc[h][c * G::VEC + i] += p[h] * vf[i];
        }
      }
    }
#pragma unroll
    for (int h = 0; h < HEADS; ++h) m[h] = m_new[h];
  }

  // Merge the groups of each warp (lanes lane_in_group, +GROUP, ... hold the same dims).
#pragma unroll
  for (int mask = G::GROUP; mask < WARP; mask *= 2) {
#pragma unroll
    for (int h = 0; h < HEADS; ++h) {
      const float m_o = __shfl_xor_sync(FULL_MASK, m[h], mask);
      const float l_o = __shfl_xor_sync(FULL_MASK, l[h], mask);
      float acc_o[G::ELEMS];
#pragma unroll
      for (int i = 0; i < G::ELEMS; ++i) acc_o[i] = __shfl_xor_sync(FULL_MASK, acc[h][i], mask);
      merge_state<G::ELEMS>(m[h], l[h], acc[h], m_o, l_o, acc_o);
    }
  }

  // Then the warps, through shared memory.
  __shared__ float s_max[HEADS][NUM_WARPS], s_sum[HEADS][NUM_WARPS];
  __shared__ float s_acc[HEADS][NUM_WARPS][HEAD_DIM];
  if (group == 0) {
#pragma unroll
    for (int h = 0; h < HEADS; ++h) {
#pragma unroll
      for (int c = 0; c < G::CHUNKS_PER_LANE; ++c) {
        const int chunk = lane_in_group + c * G::GROUP;
        if (chunk < G::CHUNKS) {
#pragma unroll
          for (int i = 0; i < G::VEC; ++i) s_acc[h][warp][chunk * G::VEC + i] = acc[h][c * G::VEC + i];
        }
      }
      if (lane == 0) {
        s_max[h][warp] = m[h];
        s_sum[h][warp] = l[h];
      }
    }
  }
  __syncthreads();
  // Thread d of the block writes element d % HEAD_DIM of head d / HEAD_DIM, and so on.
  for (int d = tid; d < HEADS * HEAD_DIM; d += NUM_THREADS) {
    const int h = d / HEAD_DIM, dim = d % HEAD_DIM;
    float global_max = negative_infinity();
#pragma unroll
    for (int w = 0; w < NUM_WARPS; ++w) global_max = fmaxf(global_max, s_max[h][w]);
    float total = 0.f, a = 0.f;
#pragma unroll
    for (int w = 0; w < NUM_WARPS; ++w) {
      const float weight = s_max[h][w] == negative_infinity() ? 0.f : __expf(s_max[h][w] - global_max);
      total += s_sum[h][w] * weight;
      a += s_acc[h][w][dim] * weight;
    }
    const float inv_total = total > 0.f ? 1.f / total : 0.f;
    out[h * out_stride + dim] = a * inv_total;
    if (dim == 0 && out_max != nullptr) {
      out_max[h * stat_stride] = global_max;
      out_sum[h * stat_stride] = total;
    }
  }
}

// v1: grid (num_heads / HEADS, num_seqs); one thread block attends the whole context for
// HEADS consecutive query heads, which share one KV head (HEADS divides the GQA group).
template <int KIND, int HEAD_DIM, int BLOCK_SIZE, int HEADS>
__global__ void __launch_bounds__(NUM_THREADS)
    paged_attention_v1(float* __restrict__ out, const typename Storage<KIND>::type* __restrict__ query,
                       const typename Storage<KIND>::type* __restrict__ key_cache,
                       const typename Storage<KIND>::type* __restrict__ value_cache,
                       const int* __restrict__ block_tables, const int* __restrict__ context_lens, float scale,
                       int num_heads, int num_kv_heads, int block_size, int max_blocks_per_seq) {
  const int first_head = blockIdx.x * HEADS, seq = blockIdx.y;
  const long long row = static_cast<long long>(seq) * num_heads + first_head;
  const int kv_head = first_head / (num_heads / num_kv_heads);
  attend_range<KIND, HEAD_DIM, BLOCK_SIZE, HEADS>(
      out + row * HEAD_DIM, nullptr, nullptr, HEAD_DIM, 0, query + row * HEAD_DIM, key_cache, value_cache,
      block_tables + static_cast<long long>(seq) * max_blocks_per_seq, 0, context_lens[seq], block_size,
      num_kv_heads, kv_head, scale);
}

// v2 (split-K / flash-decoding): grid (num_heads / HEADS, num_seqs, max_partitions); each
// thread block attends one PARTITION_SIZE slice for its heads and leaves, per head, the
// slice's max, sum and normalised output.
template <int KIND, int HEAD_DIM, int BLOCK_SIZE, int HEADS>
__global__ void __launch_bounds__(NUM_THREADS)
    paged_attention_v2(float* __restrict__ partial_out, float* __restrict__ max_logits, float* __restrict__ exp_sums,
                       const typename Storage<KIND>::type* __restrict__ query,
                       const typename Storage<KIND>::type* __restrict__ key_cache,
                       const typename Storage<KIND>::type* __restrict__ value_cache,
                       const int* __restrict__ block_tables, const int* __restrict__ context_lens, float scale,
                       int num_heads, int num_kv_heads, int block_size, int max_blocks_per_seq, int max_partitions) {
  const int first_head = blockIdx.x * HEADS, seq = blockIdx.y, partition = blockIdx.z;
  const int context_len = context_lens[seq];
  const int begin = partition * PARTITION_SIZE;
  if (begin >= context_len) return;  // the whole thread block leaves together
  const int end = min_int(begin + PARTITION_SIZE, context_len);
  const long long row = static_cast<long long>(seq) * num_heads + first_head;
  const long long slot = row * max_partitions + partition;
  const int kv_head = first_head / (num_heads / num_kv_heads);
  attend_range<KIND, HEAD_DIM, BLOCK_SIZE, HEADS>(
      partial_out + slot * HEAD_DIM, max_logits + slot, exp_sums + slot,
      static_cast<long long>(max_partitions) * HEAD_DIM, max_partitions, query + row * HEAD_DIM, key_cache,
      value_cache, block_tables + static_cast<long long>(seq) * max_blocks_per_seq, begin, end, block_size,
      num_kv_heads, kv_head, scale);
}

// v2 reduce: grid (num_heads, num_seqs); rescales each partition by exp(max_i - global_max).
template <int HEAD_DIM>
__global__ void __launch_bounds__(NUM_THREADS)
    paged_attention_v2_reduce(float* __restrict__ out, const float* __restrict__ partial_out,
                              const float* __restrict__ max_logits, const float* __restrict__ exp_sums,
                              const int* __restrict__ context_lens, int num_heads, int max_partitions) {
  const int head = blockIdx.x, seq = blockIdx.y;
  const long long row = static_cast<long long>(seq) * num_heads + head;
  const int partitions = (context_lens[seq] + PARTITION_SIZE - 1) / PARTITION_SIZE;
  const float* maxes = max_logits + row * max_partitions;
  const float* sums = exp_sums + row * max_partitions;
  float global_max = negative_infinity();
  for (int p = 0; p < partitions; ++p) global_max = fmaxf(global_max, maxes[p]);
  float total = 0.f;
  for (int p = 0; p < partitions; ++p) total += sums[p] * __expf(maxes[p] - global_max);
  const float inv_total = total > 0.f ? 1.f / total : 0.f;
  for (int d = threadIdx.x; d < HEAD_DIM; d += NUM_THREADS) {
    float a = 0.f;
    for (int p = 0; p < partitions; ++p)
      a += partial_out[(row * max_partitions + p) * HEAD_DIM + d] * sums[p] * __expf(maxes[p] - global_max);
    out[row * HEAD_DIM + d] = a * inv_total;
  }
}

// Prefill: causal attention of every sequence's new tokens (the packed query rows
// query_starts[seq] .. query_starts[seq + 1]) over the sequence's cache, their own K/V already
// written; row j of a sequence with q_len new tokens sits at position context_len - q_len + j and
// sees positions 0..that one. A thread block attends one tile of up to PREFILL query rows of one
// sequence for HEADS query heads of one KV group. For each tile of KV tokens (in order, up to the
// tile's last row's position) its threads load the KV head's K and V rows with 16-byte loads
// through the block table, widened once into shared memory, and every (query row, head) pair of
// the block uses them: the scores of the tokens its row sees, one online-softmax rescale per KV
// tile, and the accumulator, whose (pair, dim) elements each thread keeps in registers. Barriers
// are reached by the whole block (its loops' bounds are the block's own), no shuffles.
constexpr int PREFILL_MAX_QUERY_TILE = 16;  // query rows a thread block attends, at most
constexpr int PREFILL_PAIR_ELEMS = 2048;  // (query row, head) pairs × HEAD_DIM: the accumulators and s_q
constexpr int PREFILL_KV_ELEMS = 2048;  // KV tile tokens × HEAD_DIM (K and V in fp32 in shared memory)
constexpr int PREFILL_MAX_KV_TILE = 32;

// Query rows a thread block attends for HEADS heads of HEAD_DIM (the launch code's tiles match).
__host__ __device__ constexpr int prefill_query_tile(int head_dim, int heads) {
  return max_int(1, min_int(PREFILL_MAX_QUERY_TILE, PREFILL_PAIR_ELEMS / (head_dim * heads)));
}
__host__ __device__ constexpr int prefill_kv_tile(int head_dim) {
  return min_int(PREFILL_MAX_KV_TILE, PREFILL_KV_ELEMS / head_dim);
}

// grid (number of query tiles, num_heads / HEADS); tile x is rows tile_rows[x] .. of sequence
// tile_seqs[x], at most prefill_query_tile(HEAD_DIM, HEADS) of them.
template <int KIND, int HEAD_DIM, int HEADS>
__global__ void __launch_bounds__(NUM_THREADS)
    paged_prefill(float* __restrict__ out, const typename Storage<KIND>::type* __restrict__ query,
                  const typename Storage<KIND>::type* __restrict__ key_cache,
                  const typename Storage<KIND>::type* __restrict__ value_cache, const int* __restrict__ query_starts,
                  const int* __restrict__ tile_seqs, const int* __restrict__ tile_rows,
                  const int* __restrict__ block_tables, const int* __restrict__ context_lens, float scale,
                  int num_heads, int num_kv_heads, int block_size, int max_blocks_per_seq) {
  constexpr int VEC = Vec<KIND>::N;
  constexpr int CHUNKS = HEAD_DIM / VEC;
  constexpr int QUERY_TILE = prefill_query_tile(HEAD_DIM, HEADS);
  constexpr int KV_TILE = prefill_kv_tile(HEAD_DIM);
  constexpr int PAIRS = QUERY_TILE * HEADS;  // pair = row in the tile * HEADS + head in the block
  constexpr int K_STRIDE = HEAD_DIM + 1;  // padded: threads scoring consecutive tokens read distinct banks
  constexpr int ACC = (PAIRS * HEAD_DIM + NUM_THREADS - 1) / NUM_THREADS;  // (pair, dim) elements a thread owns
  static_assert(HEAD_DIM % 8 == 0 && HEAD_DIM <= 256, "head_dim must be a multiple of 8, at most 256");

  __shared__ float s_q[PAIRS][HEAD_DIM];  // the tile's queries, scaled
  __shared__ float s_k[KV_TILE][K_STRIDE];
  __shared__ float s_v[KV_TILE][HEAD_DIM];
  __shared__ float s_p[PAIRS][KV_TILE];  // scores, then exp(score - max)
  __shared__ float s_max[PAIRS], s_sum[PAIRS], s_correction[PAIRS];

  const int tid = threadIdx.x;
  const int seq = tile_seqs[blockIdx.x], row0 = tile_rows[blockIdx.x];
  const int q_begin = query_starts[seq], q_end = query_starts[seq + 1];
  const int rows = min_int(QUERY_TILE, q_end - row0);
  // Row i of the tile sits at position first_pos + i; the last row sees kv_len tokens.
  const int first_pos = context_lens[seq] - (q_end - q_begin) + (row0 - q_begin);
  const int kv_len = first_pos + rows;
  const int first_head = blockIdx.y * HEADS, group = num_heads / num_kv_heads;
  const int kv_head = first_head / group;  // the block's heads are consecutive, within one group
  const int* block_table = block_tables + static_cast<long long>(seq) * max_blocks_per_seq;
  const long long token_stride = static_cast<long long>(num_kv_heads) * HEAD_DIM;

  for (int c = tid; c < PAIRS * CHUNKS; c += NUM_THREADS) {
    const int pair = c / CHUNKS, chunk = c % CHUNKS;
    const int i = pair / HEADS, h = pair % HEADS;
    float f[VEC];
    if (i < rows) {
      load_vec<KIND>(query + (static_cast<long long>(row0 + i) * num_heads + first_head + h) * HEAD_DIM + chunk * VEC,
                     f);
    } else {
#pragma unroll
      for (int e = 0; e < VEC; ++e) f[e] = 0.f;
    }
#pragma unroll
    for (int e = 0; e < VEC; ++e) s_q[pair][chunk * VEC + e] = f[e] * scale;
  }
  for (int pair = tid; pair < PAIRS; pair += NUM_THREADS) {
    s_max[pair] = negative_infinity();
    s_sum[pair] = 0.f;
  }
  float acc[ACC];
#pragma unroll
  for (int k = 0; k < ACC; ++k) acc[k] = 0.f;

  for (int kv0 = 0; kv0 < kv_len; kv0 += KV_TILE) {
    const int tokens = min_int(KV_TILE, kv_len - kv0);
    // The KV head's K and V rows of positions kv0 .. kv0 + tokens, through the block table.
    for (int c = tid; c < tokens * CHUNKS; c += NUM_THREADS) {
      const int t = c / CHUNKS, chunk = c % CHUNKS;
      const int pos = kv0 + t;
      const long long physical = static_cast<long long>(block_table[pos / block_size]);
      const long long base = (physical * block_size + pos % block_size) * token_stride +
                             static_cast<long long>(kv_head) * HEAD_DIM + chunk * VEC;
      float kf[VEC], vf[VEC];
      load_vec<KIND>(key_cache + base, kf);
      load_vec<KIND>(value_cache + base, vf);
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        s_k[t][chunk * VEC + e] = kf[e];
        s_v[t][chunk * VEC + e] = vf[e];
      }
    }
    __syncthreads();  // the tile's K/V (and, the first time, the queries and states) are in place
    // Scores of the tokens each pair's row sees (causal: token position ≤ the row's).
    for (int e = tid; e < PAIRS * KV_TILE; e += NUM_THREADS) {
      const int pair = e / KV_TILE, t = e % KV_TILE;
      const int seen = min_int(tokens, first_pos + pair / HEADS + 1 - kv0);
      if (pair / HEADS < rows && t < seen) {
        float s = 0.f;
#pragma unroll 8
        for (int d = 0; d < HEAD_DIM; ++d) s += s_q[pair][d] * s_k[t][d];
        s_p[pair][t] = s;
      }
    }
    __syncthreads();
    // The online softmax: one thread a pair rescales its state once for the whole KV tile.
    for (int pair = tid; pair < PAIRS; pair += NUM_THREADS) {
      const int seen = min_int(tokens, first_pos + pair / HEADS + 1 - kv0);
      float correction = 1.f;
      if (pair / HEADS < rows && seen > 0) {
        float tile_max = s_max[pair];
        for (int t = 0; t < seen; ++t) tile_max = fmaxf(tile_max, s_p[pair][t]);
        correction = __expf(s_max[pair] - tile_max);  // 0 while the max is still -inf
        float sum = s_sum[pair] * correction;
        for (int t = 0; t < seen; ++t) {
          const float p = __expf(s_p[pair][t] - tile_max);
          s_p[pair][t] = p;
          sum += p;
        }
        s_sum[pair] = sum;
        s_max[pair] = tile_max;
      }
      s_correction[pair] = correction;
    }
    __syncthreads();
    // The accumulators: thread tid owns elements tid, tid + NUM_THREADS, ... of the (pair, dim) grid.
#pragma unroll
    for (int k = 0; k < ACC; ++k) {
      const int e = tid + k * NUM_THREADS;
      if (e < PAIRS * HEAD_DIM) {
        const int pair = e / HEAD_DIM, d = e % HEAD_DIM;
        const int seen = min_int(tokens, first_pos + pair / HEADS + 1 - kv0);
        if (pair / HEADS < rows && seen > 0) {
          float a = acc[k] * s_correction[pair];
          for (int t = 0; t < seen; ++t) a += s_p[pair][t] * s_v[t][d];
          acc[k] = a;
        }
      }
    }
    __syncthreads();  // before the next KV tile overwrites s_k, s_v and s_p
  }

#pragma unroll
  for (int k = 0; k < ACC; ++k) {
    const int e = tid + k * NUM_THREADS;
    const int pair = e / HEAD_DIM, d = e % HEAD_DIM;
    const int i = pair / HEADS, h = pair % HEADS;
    if (e < PAIRS * HEAD_DIM && i < rows) {
      const float total = s_sum[pair];
      out[(static_cast<long long>(row0 + i) * num_heads + first_head + h) * HEAD_DIM + d] =
          total > 0.f ? acc[k] / total : 0.f;
    }
  }
}

// vLLM's reshape_and_cache: token i's K/V (num_kv_heads * head_dim values) go to flat
// slot slot_mapping[i] = block * block_size + offset. Negative slots are skipped.
template <typename T>
__global__ void reshape_and_cache(const T* __restrict__ key, const T* __restrict__ value, T* __restrict__ key_cache,
                                  T* __restrict__ value_cache, const long long* __restrict__ slot_mapping,
                                  int token_size) {
  const long long slot = slot_mapping[blockIdx.x];
  if (slot < 0) return;
  const long long src = static_cast<long long>(blockIdx.x) * token_size;
  const long long dst = slot * token_size;
  for (int i = threadIdx.x; i < token_size; i += blockDim.x) {
    key_cache[dst + i] = key[src + i];
    value_cache[dst + i] = value[src + i];
  }
}

// Copy whole blocks for copy-on-write: block_mapping holds (src, dst) pairs.
template <typename T>
__global__ void copy_blocks(T* __restrict__ key_cache, T* __restrict__ value_cache,
                            const long long* __restrict__ block_mapping, long long block_elems) {
  const long long src = block_mapping[2 * blockIdx.x] * block_elems;
  const long long dst = block_mapping[2 * blockIdx.x + 1] * block_elems;
  for (long long i = threadIdx.x; i < block_elems; i += blockDim.x) {
    key_cache[dst + i] = key_cache[src + i];
    value_cache[dst + i] = value_cache[src + i];
  }
}

}  // namespace pagesim
