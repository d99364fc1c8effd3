#include "transport/shm.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <signal.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <vector>

#include "kernels/reduce_cpu.h"
#include "transport/ring.h"

namespace hocc {

struct ShmComm::Header {
  alignas(64) uint64_t arrivals;  // barrier arrivals, ever
  alignas(64) uint32_t gen;       // low 32 bits of the last completed barrier (the futex word)
  alignas(64) uint32_t abort;     // 1 + the member that failed first: the segment is unusable
};

// Each member's own record, after the header: who it is (to tell a dead peer
// from a slow one), the last barrier it reached (to name who is missing), and
// the call it is in (two slots, alternating per checked call: a member can be
// one call ahead while a peer still reads the previous one).
struct ShmComm::Member {
  alignas(64) uint64_t arrived;
  int32_t pid;
  CallId call[2];
};

namespace {

constexpr size_t kAlign = 4096;
constexpr size_t kMembers = 256;  // the members' records start here

size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

long futex(uint32_t* word, int op, uint32_t val, const timespec* timeout) {
  // shared (not FUTEX_PRIVATE): the word lives in memory mapped by several processes
  return syscall(SYS_futex, word, op, val, timeout, nullptr, 0);
}

std::string seconds(double s) {
  char b[32];
  std::snprintf(b, sizeof b, s < 10 ? "%.1f s" : "%.0f s", s);
  return b;
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

size_t ShmComm::header_bytes(int n) { return round_up(kMembers + size_t(n) * sizeof(Member), kAlign); }

size_t ShmComm::segment_bytes(int n, size_t half_bytes) {
  return header_bytes(n) + size_t(n) * 2 * round_up(half_bytes, kAlign);
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
  members_ = reinterpret_cast<Member*>(base_ + kMembers);
  __atomic_store_n(&members_[me].pid, int32_t(getpid()), __ATOMIC_RELEASE);
}

ShmComm::~ShmComm() {
  if (base_) munmap(base_, bytes_);
}

char* ShmComm::slot(int member, int half) const {
  return base_ + header_bytes(n) + (size_t(member) * 2 + half) * half_bytes_;
}

void ShmComm::check_usable() const {
  if (!broken_.empty())
    throw Error("hocc shm: this host group failed earlier (" + broken_ + "); not waiting again");
}

void ShmComm::abort(const std::string& why) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (aborted_.empty()) aborted_ = why.empty() ? "aborted" : why;
  }
  uint32_t none = 0;  // the first member to fail is the one peers name
  __atomic_compare_exchange_n(&hdr_->abort, &none, uint32_t(me + 1), false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
  futex(&hdr_->gen, FUTEX_WAKE, INT32_MAX, nullptr);
}

void ShmComm::fail(const std::string& why, bool mismatch) {
  broken_ = why;
  uint32_t none = 0;  // the first member to fail is the one peers name
  __atomic_compare_exchange_n(&hdr_->abort, &none, uint32_t(me + 1), false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
  futex(&hdr_->gen, FUTEX_WAKE, INT32_MAX, nullptr);
  if (mismatch) throw MismatchError("hocc shm: " + why);
  throw Error("hocc shm: " + why);
}

std::string ShmComm::missing(uint64_t want) const {
  std::string s;
  for (int j = 0; j < n; ++j)
    if (__atomic_load_n(&members_[j].arrived, __ATOMIC_ACQUIRE) < want) s += (s.empty() ? "" : ", ") + who(j);
  return s;
}

namespace {

// gone, or a zombie nobody has reaped yet (it will never arrive either)
bool is_dead(int32_t pid) {
  if (::kill(pid, 0) != 0) return errno == ESRCH;
  char path[64], buf[256];
  std::snprintf(path, sizeof path, "/proc/%d/stat", int(pid));
  int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  ssize_t got = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (got <= 0) return false;
  buf[got] = 0;
  const char* end = std::strrchr(buf, ')');  // "pid (name) S ...": the state follows the name
  return end && (end[2] == 'Z' || end[2] == 'X');
}

}  // namespace

void ShmComm::check_alive(uint64_t want) {
  for (int j = 0; j < n; ++j) {
    if (j == me || __atomic_load_n(&members_[j].arrived, __ATOMIC_ACQUIRE) >= want) continue;
    const int32_t pid = __atomic_load_n(&members_[j].pid, __ATOMIC_ACQUIRE);
    if (pid > 0 && is_dead(pid))
      fail(who(j) + " (pid " + std::to_string(pid) + ") died while its host group waited for it");
  }
}

void ShmComm::barrier() {
  ++seq_;
  if (n == 1) return;
  // the call's first barrier here: post which call we are in, compare once through
  const bool check = call && call->seq != agreed_;
  if (check) members_[me].call[checked_ % 2] = *call;
  const uint32_t want = uint32_t(seq_);
  __atomic_store_n(&members_[me].arrived, seq_, __ATOMIC_RELEASE);
  const uint64_t arrived = __atomic_add_fetch(&hdr_->arrivals, 1, __ATOMIC_ACQ_REL);
  if (arrived == seq_ * uint64_t(n)) {  // last one in: release everyone
    __atomic_store_n(&hdr_->gen, want, __ATOMIC_RELEASE);
    if (wait_ == WaitMode::futex || wait_ == WaitMode::hybrid) futex(&hdr_->gen, FUTEX_WAKE, INT32_MAX, nullptr);
  } else {
    wait_for(want);
  }
  if (check) agree();
}

void ShmComm::agree() {
  const CallId& mine = members_[me].call[checked_ % 2];
  for (int j = 0; j < n; ++j) {
    if (j == me) continue;
    CallId theirs = members_[j].call[checked_ % 2];
    std::string d = differences(mine, theirs);
    if (!d.empty())
      fail("the ranks disagree on this call: " + who(j) + " is in " + describe(theirs) + ", this rank in " +
           describe(mine) + ": " + d + ". Every rank must make the same collective calls in the same order "
           "with the same sizes, dtypes and ops (HOCC_CHECK=1 compares every rank's call before any byte moves)",
           true);
  }
  agreed_ = mine.seq;
  ++checked_;
}

// futex mode, in an op of one piece (a small call: its time is its barriers' latency), yields this long
// before it sleeps: the barrier is over within it when the peers run (a sleep and its wake-up cost a
// 4-byte all_reduce 60-70 us here), and a longer wait sleeps after it. 1 ms covers a small call's wait
// for its leader's network step: with 50 us the host's other ranks slept through it and woke about
// 160 us after the leader's broadcast began (emulated 2x4 at 1 Gbit/s, leaders all_gather of 32 B; per
// call 0.10-0.14 ms against 0.15-0.18, bench/results/shm-wait/). An op of many pieces sleeps at once:
// there, 8 ranks yielding on 2 cores at every barrier cost 16 MiB all_reduce 25% (flat8).
constexpr std::chrono::microseconds kYieldFirst{1000};

void ShmComm::wait_for(uint32_t want) {
  auto done = [&] { return int32_t(__atomic_load_n(&hdr_->gen, __ATOMIC_ACQUIRE) - want) >= 0; };
  auto start = std::chrono::steady_clock::now();
  auto deadline = start + std::chrono::duration<double>(timeout_s_);
  auto next_check = start + std::chrono::milliseconds(100);
  for (int i = 0; i < 64 && !done(); ++i) cpu_relax();
  long pause_ns = 20000;
  while (!done()) {
    if (const uint32_t by = __atomic_load_n(&hdr_->abort, __ATOMIC_ACQUIRE)) {
      std::string why;
      {
        std::lock_guard<std::mutex> lk(mu_);
        why = aborted_;
      }
      fail(!why.empty() ? "aborted: " + why
           : int(by) - 1 == me ? "this rank failed in another stage"
                               : who(int(by) - 1) + " failed (its error is raised on that rank)");
    }
    auto now = std::chrono::steady_clock::now();
    if (now > deadline)
      fail("timed out after " + seconds(timeout_s_) + " waiting for " + missing(seq_) +
           " at a host barrier (stopped, hung, or in another call?)");
    if (now > next_check) {  // a dead peer fails the group now, not at the deadline
      check_alive(seq_);
      next_check = now + std::chrono::milliseconds(100);
    }
    WaitMode mode = wait_;
    if (mode == WaitMode::hybrid)
      mode = now - start < std::chrono::milliseconds(1) ? WaitMode::yield : WaitMode::futex;
    else if (mode == WaitMode::futex && one_piece_ && now - start < kYieldFirst)
      mode = WaitMode::yield;
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
  one_piece_ = seg <= cap;
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
  one_piece_ = seg <= cap;
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
  one_piece_ = count <= cap;
  std::vector<const void*> srcs(n);
  if (count * es <= kWholeReduceBytes) {
    // small: every member reduces the whole piece over every slot, in slot order (so alike on every member):
    // one barrier instead of two, for n times the reduction work, which at this size costs less than a
    // barrier's wake-ups
    const int h = int(piece_++ % 2);
    std::memcpy(slot(me, h), src, count * es);
    barrier();
    for (int i = 0; i < n; ++i) srcs[i] = slot(i, h);
    reduce_cpu_many(dst, srcs.data(), n, count, t, op);
    return;
  }
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

void ShmComm::broadcast(char* dst, size_t count, DType t, const Lane&) {
  check_usable();
  const size_t es = dtype_size(t), cap = half_bytes_ / es;
  one_piece_ = count <= cap;
  for (size_t start = 0; start < count; start += cap, ++piece_) {
    const size_t len = std::min(cap, count - start);
    const int h = int(piece_ % 2);
    if (me == 0) std::memcpy(slot(0, h), dst + start * es, len * es);
    barrier();
    if (me != 0) std::memcpy(dst + start * es, slot(0, h), len * es);
  }
}

void ShmComm::exchange(const char*, size_t, char*, size_t, DType, RedOp, const Lane&) {
  throw Error("hocc shm: the shared-memory transport runs whole collectives, not ring steps");
}

}  // namespace hocc
