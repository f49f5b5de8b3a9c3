// A host emulation of the CUDA execution model, enough to run kernels/paged_attention.cu
// unmodified on the CPU (its one guarded fallback is the inline-PTX half conversion).
//
// - Every CUDA thread of a block is a fiber with its own stack (ucontext to start it,
//   _setjmp/_longjmp to switch: no signal-mask syscall per switch). Blocks run one after
//   another on the calling OS thread, so `static thread_local` storage is per-block
//   shared memory.
// - __syncthreads and __shfl_xor_sync are real rendezvous: a fiber runs until it reaches
//   one, then waits until every thread of its block (or every lane its mask names) is
//   there. Lanes that meet at different call sites, or after a different number of warp
//   syncs, or that exited while others wait, are reported as divergence; a state in which
//   nothing can run is reported as a deadlock naming where each thread waits.
// - __expf rounds x * log2(e) to fp32 and takes exp2f of that, as the device's
//   ex2.approx does (ex2.approx itself is within 2 ulp of the exact 2^y; exp2f within 1).
#pragma once

#include <math.h>
#include <setjmp.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#define CUDA_EMU_ASAN 1
#else
#define CUDA_EMU_ASAN 0
#endif

#define PAGESIM_HOST_EMULATION 1

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static thread_local

struct dim3 {
  unsigned int x = 1, y = 1, z = 1;
};
namespace cuda_emu {
void record_load(const void* address);
}

// A 16-byte vector. Its copy constructor is where the kernels' vector loads happen
// (``*reinterpret_cast<const uint4*>(p)``): it records the address read when recording is on.
struct alignas(16) uint4 {
  unsigned int x, y, z, w;
  uint4() = default;
  uint4(const uint4& other) : x(other.x), y(other.y), z(other.z), w(other.w) { cuda_emu::record_load(&other); }
  uint4& operator=(const uint4&) = default;
};

namespace cuda_emu {

enum class State { Runnable, AtBarrier, AtShuffle, Done };

struct Fiber {
  jmp_buf env;
  ucontext_t start_context;
  void* stack = nullptr;
  size_t stack_size = 0;
  bool started = false;
  State state = State::Runnable;
  dim3 thread_idx;
  int linear = 0;
  // Where it waits, and how many rendezvous of that kind it passed before.
  const char* file = "";
  int line = 0;
  long long barriers = 0, warp_syncs = 0;
  // One shuffle in flight.
  unsigned int shfl_mask = 0;
  int shfl_lane_mask = 0;
  uint64_t shfl_value = 0, shfl_result = 0;
  void* asan_fake_stack = nullptr;
};

struct Runtime {
  dim3 grid, block, block_idx;
  std::vector<Fiber> fibers;
  Fiber* current = nullptr;
  jmp_buf scheduler_env;
  ucontext_t scheduler_context;
  const std::function<void()>* body = nullptr;
  std::string error;
  void* asan_scheduler_fake_stack = nullptr;
  const void* scheduler_stack_bottom = nullptr;
  size_t scheduler_stack_size = 0;
};

inline thread_local Runtime* runtime_ptr = nullptr;

// The access log: every 16-byte load, with the thread block and thread that made it.
struct LoadRecord {
  unsigned block_x, block_y, block_z;
  int thread;
  const void* address;
};
inline thread_local bool recording = false;
inline thread_local std::vector<LoadRecord> load_log;

inline void record_load(const void* address) {
  if (!recording || runtime_ptr == nullptr || runtime_ptr->current == nullptr) return;
  const Runtime& rt = *runtime_ptr;
  load_log.push_back({rt.block_idx.x, rt.block_idx.y, rt.block_idx.z, rt.current->linear, address});
}

inline Runtime& runtime() { return *runtime_ptr; }
inline Fiber& current() { return *runtime_ptr->current; }

// -- fiber switching --------------------------------------------------------------------
inline void yield_to_scheduler() {
  Runtime& rt = runtime();
  Fiber& f = *rt.current;
  if (!_setjmp(f.env)) {
#if CUDA_EMU_ASAN
    __sanitizer_start_switch_fiber(f.state == State::Done ? nullptr : &f.asan_fake_stack, rt.scheduler_stack_bottom,
                                   rt.scheduler_stack_size);
#endif
    _longjmp(rt.scheduler_env, 1);
  }
#if CUDA_EMU_ASAN
  __sanitizer_finish_switch_fiber(f.asan_fake_stack, nullptr, nullptr);
#endif
}

inline void fiber_entry() {
  Runtime& rt = runtime();
#if CUDA_EMU_ASAN
  __sanitizer_finish_switch_fiber(nullptr, &rt.scheduler_stack_bottom, &rt.scheduler_stack_size);
#endif
  (*rt.body)();
  rt.current->state = State::Done;
  rt.current->file = "exit";
  rt.current->line = 0;
  yield_to_scheduler();  // never resumed: a finished fiber is not run again
  __builtin_trap();
}

inline void resume(Fiber& f) {
  Runtime& rt = runtime();
  rt.current = &f;
  if (!_setjmp(rt.scheduler_env)) {
#if CUDA_EMU_ASAN
    __sanitizer_start_switch_fiber(&rt.asan_scheduler_fake_stack, f.stack, f.stack_size);
#endif
    if (!f.started) {
      f.started = true;
      swapcontext(&rt.scheduler_context, &f.start_context);
    } else {
      _longjmp(f.env, 1);
    }
  }
#if CUDA_EMU_ASAN
  __sanitizer_finish_switch_fiber(rt.asan_scheduler_fake_stack, nullptr, nullptr);
#endif
  rt.current = nullptr;
}

// -- reporting --------------------------------------------------------------------------
inline std::string describe(const Fiber& f) {
  char buf[160];
  switch (f.state) {
    case State::Done:
      return "finished";
    case State::Runnable:
      return "running";
    case State::AtBarrier:
      snprintf(buf, sizeof buf, "wait at __syncthreads %s:%d (barrier #%lld)", f.file, f.line, f.barriers);
      return buf;
    case State::AtShuffle:
      snprintf(buf, sizeof buf, "wait at __shfl_xor_sync %s:%d (warp sync #%lld)", f.file, f.line, f.warp_syncs);
      return buf;
  }
  return "?";
}

// "threads 0-15 wait at ...; threads 16-31 finished" (runs of equal state grouped).
inline std::string describe_threads(const std::vector<Fiber>& fibers, size_t begin, size_t end) {
  std::string out;
  size_t i = begin;
  while (i < end) {
    const std::string what = describe(fibers[i]);
    size_t j = i + 1;
    while (j < end && describe(fibers[j]) == what) ++j;
    char head[64];
    if (j - i == 1)
      snprintf(head, sizeof head, "thread %zu ", i);
    else
      snprintf(head, sizeof head, "threads %zu-%zu ", i, j - 1);
    if (!out.empty()) out += "; ";
    out += head + what;
    i = j;
  }
  return out;
}

inline std::string where_block() {
  const Runtime& rt = runtime();
  char buf[96];
  snprintf(buf, sizeof buf, "block (%u,%u,%u): ", rt.block_idx.x, rt.block_idx.y, rt.block_idx.z);
  return buf;
}

inline void fail(const std::string& message) {
  Runtime& rt = runtime();
  if (rt.error.empty()) rt.error = where_block() + message;
}

// -- rendezvous -------------------------------------------------------------------------
// A warp's shuffle completes once every lane its mask names waits at it.
inline void try_complete_shuffle(size_t warp) {
  Runtime& rt = runtime();
  const size_t begin = warp * 32, end = std::min(rt.fibers.size(), begin + 32);
  const Fiber& first = rt.fibers[rt.current - rt.fibers.data()];
  const unsigned mask = first.shfl_mask;
  for (size_t i = begin; i < end; ++i) {
    const Fiber& f = rt.fibers[i];
    if (!(mask >> (i - begin) & 1u)) continue;
    if (f.state == State::Done) {
      fail("divergent shuffle in warp " + std::to_string(warp) + ": a lane its mask names has exited: " +
           describe_threads(rt.fibers, begin, end));
      return;
    }
    if (f.state != State::AtShuffle) return;  // not there yet
  }
  if (end - begin < 32 && (mask >> (end - begin)) != 0) {
    fail("shuffle mask names lanes beyond the block's threads");
    return;
  }
  for (size_t i = begin; i < end; ++i) {
    const Fiber& f = rt.fibers[i];
    if (!(mask >> (i - begin) & 1u)) continue;
    if (f.line != first.line || strcmp(f.file, first.file) != 0 || f.warp_syncs != first.warp_syncs ||
        f.shfl_mask != mask || f.shfl_lane_mask != first.shfl_lane_mask) {
      fail("divergent shuffle in warp " + std::to_string(warp) +
           ": lanes meet at different shuffles: " + describe_threads(rt.fibers, begin, end));
      return;
    }
  }
  for (size_t i = begin; i < end; ++i) {
    Fiber& f = rt.fibers[i];
    if (!(mask >> (i - begin) & 1u)) continue;
    const size_t source = begin + ((i - begin) ^ static_cast<size_t>(f.shfl_lane_mask));
    const bool inside = source < end && (mask >> (source - begin) & 1u);
    f.shfl_result = inside ? rt.fibers[source].shfl_value : f.shfl_value;
    f.state = State::Runnable;
  }
}

inline void try_complete_barrier() {
  Runtime& rt = runtime();
  const Fiber& first = *rt.current;
  bool any_done = false;
  for (const Fiber& f : rt.fibers) {
    if (f.state == State::Done) any_done = true;
    else if (f.state != State::AtBarrier) return;  // someone still on its way (or at a shuffle)
  }
  if (any_done) {
    fail("__syncthreads reached by only part of the block (others exited): " +
         describe_threads(rt.fibers, 0, rt.fibers.size()));
    return;
  }
  for (const Fiber& f : rt.fibers) {
    if (f.line != first.line || strcmp(f.file, first.file) != 0 || f.barriers != first.barriers) {
      fail("divergent __syncthreads: threads wait at different barriers: " +
           describe_threads(rt.fibers, 0, rt.fibers.size()));
      return;
    }
  }
  for (Fiber& f : rt.fibers) f.state = State::Runnable;
}

inline void syncthreads(const char* file, int line) {
  Fiber& f = current();
  f.state = State::AtBarrier;
  f.file = file;
  f.line = line;
  yield_to_scheduler();
  ++f.barriers;
}

template <typename T>
inline T shfl_xor(unsigned mask, T value, int lane_mask, const char* file, int line) {
  static_assert(sizeof(T) <= 8, "shuffles move at most 8 bytes");
  Fiber& f = current();
  f.state = State::AtShuffle;
  f.file = file;
  f.line = line;
  f.shfl_mask = mask;
  f.shfl_lane_mask = lane_mask;
  f.shfl_value = 0;
  memcpy(&f.shfl_value, &value, sizeof(T));
  yield_to_scheduler();
  ++f.warp_syncs;
  T out;
  memcpy(&out, &f.shfl_result, sizeof(T));
  return out;
}

// -- launching --------------------------------------------------------------------------
constexpr size_t kStackSize = CUDA_EMU_ASAN ? (512 << 10) : (128 << 10);

struct Stacks {
  std::vector<void*> stacks;
  ~Stacks() {
    for (void* s : stacks) munmap(static_cast<char*>(s) - getpagesize(), kStackSize + getpagesize());
  }
  void* get(size_t i) {
    while (stacks.size() <= i) {
      // A guard page under each stack: an overflow faults instead of corrupting a neighbour.
      const size_t page = getpagesize();
      char* base = static_cast<char*>(
          mmap(nullptr, kStackSize + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
      if (base == MAP_FAILED) return nullptr;
      mprotect(base, page, PROT_NONE);
      stacks.push_back(base + page);
    }
    return stacks[i];
  }
};

inline thread_local Stacks stacks;

// Run one block to completion; returns false (with rt.error set) on divergence or deadlock.
inline bool run_block(Runtime& rt) {
  const size_t n = static_cast<size_t>(rt.block.x) * rt.block.y * rt.block.z;
  rt.fibers.assign(n, Fiber{});
  for (size_t i = 0; i < n; ++i) {
    Fiber& f = rt.fibers[i];
    f.linear = static_cast<int>(i);
    f.thread_idx.x = static_cast<unsigned>(i % rt.block.x);
    f.thread_idx.y = static_cast<unsigned>(i / rt.block.x % rt.block.y);
    f.thread_idx.z = static_cast<unsigned>(i / (static_cast<size_t>(rt.block.x) * rt.block.y));
    f.stack = stacks.get(i);
    f.stack_size = kStackSize;
    if (f.stack == nullptr) {
      rt.error = "could not map a fiber stack";
      return false;
    }
    getcontext(&f.start_context);
    f.start_context.uc_stack.ss_sp = f.stack;
    f.start_context.uc_stack.ss_size = f.stack_size;
    f.start_context.uc_link = nullptr;
    makecontext(&f.start_context, fiber_entry, 0);
  }
  size_t done = 0;
  while (done < n) {
    bool progressed = false;
    for (size_t i = 0; i < n; ++i) {
      Fiber& f = rt.fibers[i];
      if (f.state != State::Runnable) continue;
      progressed = true;
      resume(f);
      rt.current = &f;
      if (f.state == State::Done) {
        ++done;
        // A lane that leaves may be the last one a waiting shuffle or barrier needs to know about.
        for (const Fiber& g : rt.fibers) {
          if (g.state == State::AtShuffle && g.linear / 32 == f.linear / 32) {
            rt.current = &rt.fibers[g.linear];
            try_complete_shuffle(f.linear / 32);
            break;
          }
        }
        for (const Fiber& g : rt.fibers) {
          if (g.state == State::AtBarrier) {
            rt.current = &rt.fibers[g.linear];
            try_complete_barrier();
            break;
          }
        }
      } else if (f.state == State::AtShuffle) {
        try_complete_shuffle(i / 32);
      } else if (f.state == State::AtBarrier) {
        try_complete_barrier();
      }
      rt.current = nullptr;
      if (!rt.error.empty()) return false;
    }
    if (!progressed) {
      rt.error = where_block() + "deadlock: " + describe_threads(rt.fibers, 0, n);
      return false;
    }
  }
  return true;
}

// Launch `body` (the kernel call with its arguments bound) over the grid, block after block.
inline std::string launch(dim3 grid, dim3 block, const std::function<void()>& body) {
  Runtime rt;
  rt.grid = grid;
  rt.block = block;
  rt.body = &body;
  Runtime* saved = runtime_ptr;
  runtime_ptr = &rt;
  if (static_cast<size_t>(block.x) * block.y * block.z > 1024) {
    runtime_ptr = saved;
    return "a thread block holds at most 1024 threads";
  }
  for (unsigned z = 0; z < grid.z && rt.error.empty(); ++z)
    for (unsigned y = 0; y < grid.y && rt.error.empty(); ++y)
      for (unsigned x = 0; x < grid.x && rt.error.empty(); ++x) {
        rt.block_idx = dim3{x, y, z};
        run_block(rt);
      }
  runtime_ptr = saved;
  return rt.error;
}

// -- device intrinsics ------------------------------------------------------------------
inline float half_bits_to_float(unsigned short h) {
  // Exact: every binary16 value (subnormals, inf, NaN) is representable in binary32.
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu, bits;
  if (exponent == 0x1f) {
    bits = sign | 0x7f800000u | (mantissa << 13);
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112u) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    bits = sign;
  } else {  // subnormal: normalise
    int e = -1;
    do {
      mantissa <<= 1;
      ++e;
    } while (!(mantissa & 0x400u));
    bits = sign | ((112u - e) << 23) | ((mantissa & 0x3ffu) << 13);
  }
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

}  // namespace cuda_emu

#define threadIdx (::cuda_emu::current().thread_idx)
#define blockIdx (::cuda_emu::runtime().block_idx)
#define blockDim (::cuda_emu::runtime().block)
#define gridDim (::cuda_emu::runtime().grid)
#define __syncthreads() ::cuda_emu::syncthreads(__FILE__, __LINE__)
#define __shfl_xor_sync(mask, value, lane_mask) ::cuda_emu::shfl_xor((mask), (value), (lane_mask), __FILE__, __LINE__)

inline float __int_as_float(int i) {
  float f;
  memcpy(&f, &i, 4);
  return f;
}
inline float __uint_as_float(unsigned int u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}
inline float __expf(float x) { return exp2f(x * 1.44269504088896340736f); }
inline float pagesim_emulated_half_to_float(unsigned short h) { return cuda_emu::half_bits_to_float(h); }
