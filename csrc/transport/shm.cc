#include "transport/shm.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <vector>

#include "kernels/reduce_cpu.h"
#include "transport/ring.h"

namespace hocc {

struct ShmComm::Header {
  alignas(64) uint64_t arrivals;  // barrier arrivals, ever
  alignas(64) uint32_t gen;       // low 32 bits of the last completed barrier (the futex word)
  alignas(64) uint32_t abort;     // a member failed: the segment is unusable
};

namespace {

constexpr size_t kHeader = 4096;
constexpr size_t kAlign = 4096;

size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

long futex(uint32_t* word, int op, uint32_t val, const timespec* timeout) {
  // shared (not FUTEX_PRIVATE): the word lives in memory mapped by several processes
  return syscall(SYS_futex, word, op, val, timeout, nullptr, 0);
}

inline void cpu_relax() {
#if defined(__x86_64__)
  __builtin_ia32_pause();
#endif
}

}  // namespace

WaitMode parse_wait_mode(const std::string& n) {
  if (n == "futex") return WaitMode::futex;
  if (n == "yield") return WaitMode::yield;
  if (n == "sleep") return WaitMode::sleep;
  if (n == "hybrid") return WaitMode::hybrid;
  throw Error("hocc shm: unknown wait mode '" + n + "'; use futex, hybrid, yield or sleep");
}

size_t ShmComm::segment_bytes(int n, size_t half_bytes) {
  return kHeader + size_t(n) * 2 * round_up(half_bytes, kAlign);
}

ShmComm::ShmComm(const std::string& path, int me, int n, size_t half_bytes, double timeout_s, WaitMode wait)
    : Comm(me, n), half_bytes_(round_up(half_bytes, kAlign)), timeout_s_(timeout_s), wait_(wait) {
  if (n < 1 || me < 0 || me >= n) throw Error("hocc shm: member " + std::to_string(me) + " of " + std::to_string(n));
  if (half_bytes < 4096) throw Error("hocc shm: slots must hold at least 4096 bytes");
  bytes_ = segment_bytes(n, half_bytes_);
  int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) throw Error("hocc shm: cannot open " + path + ": " + std::strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0 || size_t(st.st_size) < bytes_) {
    ::close(fd);
    throw Error("hocc shm: segment " + path + " is smaller than " + std::to_string(bytes_) + " bytes");
  }
  void* p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);  // the mapping keeps the memory; the file can be unlinked now
  if (p == MAP_FAILED) throw Error(std::string("hocc shm: mmap failed: ") + std::strerror(errno));
  base_ = static_cast<char*>(p);
  hdr_ = reinterpret_cast<Header*>(base_);
}

ShmComm::~ShmComm() {
  if (base_) munmap(base_, bytes_);
}

char* ShmComm::slot(int member, int half) const {
  return base_ + kHeader + (size_t(member) * 2 + half) * half_bytes_;
}

void ShmComm::check_usable() const {
  if (!broken_.empty())
    throw Error("hocc shm: this host group failed earlier (" + broken_ + "); not waiting again");
}

void ShmComm::abort(const std::string&) {
  __atomic_store_n(&hdr_->abort, 1u, __ATOMIC_RELEASE);
  futex(&hdr_->gen, FUTEX_WAKE, INT32_MAX, nullptr);
}

void ShmComm::fail(const std::string& why) {
  broken_ = why;
  __atomic_store_n(&hdr_->abort, 1u, __ATOMIC_RELEASE);
  futex(&hdr_->gen, FUTEX_WAKE, INT32_MAX, nullptr);
  throw Error("hocc shm: " + why);
}

void ShmComm::barrier() {
  ++seq_;
  if (n == 1) return;
  const uint32_t want = uint32_t(seq_);
  const uint64_t arrived = __atomic_add_fetch(&hdr_->arrivals, 1, __ATOMIC_ACQ_REL);
  if (arrived == seq_ * uint64_t(n)) {  // last one in: release everyone
    __atomic_store_n(&hdr_->gen, want, __ATOMIC_RELEASE);
    if (wait_ == WaitMode::futex || wait_ == WaitMode::hybrid) futex(&hdr_->gen, FUTEX_WAKE, INT32_MAX, nullptr);
    return;
  }
  auto done = [&] { return int32_t(__atomic_load_n(&hdr_->gen, __ATOMIC_ACQUIRE) - want) >= 0; };
  auto start = std::chrono::steady_clock::now();
  auto deadline = start + std::chrono::duration<double>(timeout_s_);
  for (int i = 0; i < 64 && !done(); ++i) cpu_relax();
  long pause_ns = 20000;
  while (!done()) {
    if (__atomic_load_n(&hdr_->abort, __ATOMIC_ACQUIRE))
      fail("a host peer failed (its error is raised on that rank)");
    if (std::chrono::steady_clock::now() > deadline)
      fail("a host peer did not reach the barrier within " + std::to_string(int(timeout_s_)) +
           " s (did a rank die?)");
    WaitMode mode = wait_;
    if (mode == WaitMode::hybrid)
      mode = std::chrono::steady_clock::now() - start < std::chrono::milliseconds(1) ? WaitMode::yield
                                                                                    : WaitMode::futex;
    switch (mode) {
      case WaitMode::hybrid:
      case WaitMode::futex: {
        uint32_t seen = __atomic_load_n(&hdr_->gen, __ATOMIC_ACQUIRE);
        if (int32_t(seen - want) >= 0) break;
        timespec ts{0, 50 * 1000 * 1000};  // wake up now and then to check abort and the deadline
        futex(&hdr_->gen, FUTEX_WAIT, seen, &ts);
        break;
      }
      case WaitMode::yield:
        sched_yield();
        break;
      case WaitMode::sleep: {
        timespec ts{0, pause_ns};
        nanosleep(&ts, nullptr);
        pause_ns = std::min(pause_ns * 2, 1000000L);
        break;
      }
    }
  }
  waited_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void ShmComm::all_gather(const char* src, char* dst, size_t seg, DType t, const Lane&) {
  check_usable();
  const size_t es = dtype_size(t), cap = half_bytes_ / es;
  for (size_t start = 0; start < seg; start += cap, ++piece_) {
    const size_t len = std::min(cap, seg - start);
    const int h = int(piece_ % 2);
    std::memcpy(slot(me, h), src + start * es, len * es);
    barrier();
    for (int j = 0; j < n; ++j)
      if (j != me) std::memcpy(dst + (size_t(j) * seg + start) * es, slot(j, h), len * es);
  }
  char* mine = dst + size_t(me) * seg * es;
  if (mine != src) std::memcpy(mine, src, seg * es);
}

void ShmComm::reduce_scatter(const char* src, char* dst, size_t seg, DType t, RedOp op, const Lane& lane) {
  reduce_scatter_out(src, dst + size_t(me) * seg * dtype_size(t), seg, t, op, lane);
}

void ShmComm::reduce_scatter_out(const char* src, char* out, size_t seg, DType t, RedOp op, const Lane&) {
  check_usable();
  const size_t es = dtype_size(t), cap = std::max<size_t>(1, half_bytes_ / es / n);
  std::vector<const void*> srcs(n);
  for (size_t start = 0; start < seg; start += cap, ++piece_) {
    const size_t len = std::min(cap, seg - start);
    const int h = int(piece_ % 2);
    for (int i = 0; i < n; ++i)  // part i of my slot: my contribution to member i's segment
      if (i != me) std::memcpy(slot(me, h) + i * len * es, src + (size_t(i) * seg + start) * es, len * es);
    barrier();
    for (int i = 0; i < n; ++i)
      srcs[i] = i == me ? src + (size_t(me) * seg + start) * es : slot(i, h) + size_t(me) * len * es;
    reduce_cpu_many(out + start * es, srcs.data(), n, len, t, op);
  }
}

void ShmComm::all_reduce(const char* src, char* dst, size_t count, DType t, RedOp op, const Lane&) {
  check_usable();
  const size_t es = dtype_size(t), cap = half_bytes_ / es;
  std::vector<const void*> srcs(n);
  for (size_t start = 0; start < count; start += cap, ++piece_) {
    const size_t len = std::min(cap, count - start);
    const int h = int(piece_ % 2);
    char* out = dst + start * es;
    std::memcpy(slot(me, h), src + start * es, len * es);
    barrier();
    Part p = even_part(len, n, me);
    for (int i = 0; i < n; ++i) srcs[i] = slot(i, h) + p.start * es;
    reduce_cpu_many(slot(me, h) + p.start * es, srcs.data(), n, p.len, t, op);
    barrier();
    for (int j = 0; j < n; ++j) {
      Part q = even_part(len, n, j);
      std::memcpy(out + q.start * es, slot(j, h) + q.start * es, q.len * es);
    }
  }
}

void ShmComm::exchange(const char*, size_t, char*, size_t, DType, RedOp, const Lane&) {
  throw Error("hocc shm: the shared-memory transport runs whole collectives, not ring steps");
}

}  // namespace hocc
