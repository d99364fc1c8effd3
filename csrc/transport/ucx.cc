#include "transport/ucx.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "transport/ring.h"

#ifdef HOCC_HAVE_UCX
#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <ucp/api/ucp.h>
#endif

namespace hocc {

#ifndef HOCC_HAVE_UCX

// Built without UCX's headers: the engine sees ucx_unavailable() and keeps gloo.
std::string ucx_unavailable() { return "hocc._C was built without UCX (its headers were not found at build time)"; }
std::string ucx_version() { return ""; }
struct UcxComm::Impl {};
UcxComm::UcxComm(int me, int n, double, double) : Comm(me, n) { throw Error("hocc ucx: " + ucx_unavailable()); }
UcxComm::~UcxComm() = default;
std::string UcxComm::address() const { return ""; }
void UcxComm::connect(std::vector<std::string>) {}
void UcxComm::exchange(const char*, size_t, char*, size_t, DType, RedOp, const Lane&) {}
void UcxComm::exchange_with(int, const char*, size_t, int, char*, size_t, DType, RedOp, const Lane&) {}
void UcxComm::all_reduce(const char*, char*, size_t, DType, RedOp, const Lane&) {}
void UcxComm::all_gather(const char*, char*, size_t, DType, const Lane&) {}
void UcxComm::reduce_scatter_out(const char*, char*, size_t, DType, RedOp, const Lane&) {}
void UcxComm::abort(const std::string&) {}
bool UcxComm::broken() const { return true; }
size_t UcxComm::held_bytes() const { return scratch.size(); }
uint64_t UcxComm::progress_calls() const { return 0; }
uint64_t UcxComm::sleeps() const { return 0; }

#else

namespace {

std::string seconds(double s) {
  char b[32];
  std::snprintf(b, sizeof b, s < 10 ? "%.1f s" : "%.0f s", s);
  return b;
}

// The process's ucp context, made once. Transports: tcp unless UCX_TLS says
// otherwise, because hocc's UCX traffic is between hosts (a host's ranks meet
// in hocc's own shared memory), and UCX would otherwise move it through its
// shared-memory transports whenever two "hosts" share a machine (the emulated
// cluster's network namespaces), bypassing the network being measured.
// Devices: UCX_NET_DEVICES if set, else GLOO_SOCKET_IFNAME's (the interface the
// job already named for gloo), else UCX's choice.
struct Context {
  ucp_context_h h = nullptr;
  std::string error;
  Context() {
    ucp_config_t* cfg = nullptr;
    ucs_status_t st = ucp_config_read(nullptr, nullptr, &cfg);
    if (st != UCS_OK) {
      error = std::string("ucp_config_read: ") + ucs_status_string(st);
      return;
    }
    if (!std::getenv("UCX_TLS")) ucp_config_modify(cfg, "TLS", "tcp");
    const char* gloo_if = std::getenv("GLOO_SOCKET_IFNAME");
    if (!std::getenv("UCX_NET_DEVICES") && gloo_if && *gloo_if) ucp_config_modify(cfg, "NET_DEVICES", gloo_if);
    ucp_params_t p{};
    p.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
    p.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
    p.mt_workers_shared = 1;  // the comms' workers run on different lanes' threads
    st = ucp_init(&p, cfg, &h);
    ucp_config_release(cfg);
    if (st != UCS_OK) {
      error = std::string("ucp_init: ") + ucs_status_string(st);
      h = nullptr;
    }
  }
  // never cleaned up: comms may outlive static destruction order, and the OS frees it at exit
};

Context& context() {
  static Context* c = new Context();
  return *c;
}

// Tags: [63:60] kind, [59:44] the sending member, [43:0] which message.
// Data: the call's number (low 20 bits) and the exchange's place in the call
// (24 bits), so messages of two calls or two steps never match each other.
// Check: the sender only: a predecessor in another call must still be heard.
constexpr uint64_t kData = 1, kCheck = 2;
// A call's first message here carries its call id; where its data is this small it rides in the same
// message (one message instead of two: a 4-byte call's check cost 18 us on 8 ranks on 2 cores)
constexpr size_t kWithCheck = 8192;
constexpr uint64_t kKindSender = 0xfffff00000000000ULL;
uint64_t tag(uint64_t kind, int sender, uint64_t which) {
  return kind << 60 | (uint64_t(sender) & 0xffff) << 44 | (which & 0xfffffffffffULL);
}

// one send or receive in flight; the callbacks fill it in
struct Pending {
  void* req = nullptr;
  bool done = true;
  ucs_status_t status = UCS_OK;
  size_t length = 0;
};

void sent(void*, ucs_status_t st, void* user) {
  auto* o = static_cast<Pending*>(user);
  o->status = st, o->done = true;
}
void received(void*, ucs_status_t st, const ucp_tag_recv_info_t* info, void* user) {
  auto* o = static_cast<Pending*>(user);
  o->status = st, o->done = true;
  if (st == UCS_OK) o->length = info->length;
}

// progress the worker this long, yielding the core between tries, before
// sleeping on its event fd: a neighbour's reply within tens of microseconds is
// caught without a wake-up (which costs 50-70 us on these loaded 2 cores), and
// sched_yield() hands the core to a runnable peer (with more ranks than cores,
// often the one being waited for) while returning at once when there is none
// (the engine setting ucx_spin_us, HOCC_UCX_SPIN_US, passed in by the comm's maker: hocc/engine/ucx.py)

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

std::string ucx_unavailable() { return context().error; }

std::string ucx_version() {
  unsigned major, minor, release;
  ucp_get_version(&major, &minor, &release);
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(release);
}

// Idle communicators' progress. A UCX send counts done once UCX has taken it, yet its bytes can still
// wait in the endpoint's tcp transmit queue, and a rendezvous needs the sender's acknowledgement: both
// move only when the worker is progressed. Each comm's worker is progressed by the thread in its op, and
// a rank's next call may be on another communicator (another group's engine, another stage), or wait in
// shared memory or Python: a neighbour then waits on this rank's bytes while this rank waits on it
// through a third group, a deadlock (bench/soak.py found it: 4 ranks, world, host and rail groups). So a
// thread of the process progresses every comm no op holds, every kIdleProgress (10 ms: at 2 ms, the wake-ups
// of 8 ranks on 2 cores cost a 4-byte call across emulated hosts 10-40%; such a stall is rare, and short).
constexpr std::chrono::milliseconds kIdleProgress{10};
constexpr int kIdleProgressRounds = 64;  // ucp_worker_progress calls per idle comm per pass, at most

struct IdleProgress {
  std::mutex mu;
  std::set<UcxComm::Impl*> comms;
  bool started = false;
  void add(UcxComm::Impl* c);
  void remove(UcxComm::Impl* c) {
    std::lock_guard<std::mutex> lk(mu);  // the thread progresses under mu: after this, never again
    comms.erase(c);
  }
  void loop();
};

// never destroyed: its thread runs until the process exits, and comms may outlive static destruction
IdleProgress& idle_progress() {
  static IdleProgress* p = new IdleProgress();
  return *p;
}

struct UcxComm::Impl {
  UcxComm& c;
  const double timeout_s;
  const int64_t spin_ns;  // how long a wait polls before it sleeps (above)
  ucp_worker_h worker = nullptr;
  int efd = -1;        // the worker's event fd
  int wake = -1;       // an eventfd abort() writes, to end a sleep on efd
  // an endpoint per member (null where none is needed: connect() makes the ring neighbours' and Bruck's
  // partners'; any other member's is made at its first message, from its address), and its handler's argument
  std::vector<ucp_ep_h> eps;
  std::vector<std::string> addresses;
  struct Peer {
    Impl* self;
    int member;
  };
  std::vector<Peer> peers;
  std::atomic<int> lost{-1};  // a neighbour whose connection failed (its member), -1: none
  ucs_status_t lost_status = UCS_OK;
  std::mutex op_mu;           // held by the thread in an op: abort() closes the endpoints only when none is
  mutable std::mutex mu;
  std::string aborted, broken;
  std::atomic<bool> abort_flag{false};
  uint64_t agreed = ~uint64_t(0), cur_seq = ~uint64_t(0), step = 0, progressed = 0, slept = 0;
  CallId mine, theirs;
  Scratch landing;   // where a piece to reduce is received
  Scratch gathered;  // a tiny all_reduce's inputs, every member's
  Pending check_send, check_recv, data_send, data_recv;
  std::vector<char> check_out, check_in;  // a check message: the call id, then maybe the data (kWithCheck)

  Impl(UcxComm& c, double timeout_s, double spin_us) : c(c), timeout_s(timeout_s), spin_ns(int64_t(spin_us * 1e3)) {
    Context& ctx = context();
    if (!ctx.h) throw Error("hocc ucx: " + ctx.error);
    ucp_worker_params_t wp{};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;  // one lane at a time; abort() under op_mu
    ucs_status_t st = ucp_worker_create(ctx.h, &wp, &worker);
    if (st != UCS_OK) throw Error(std::string("hocc ucx: ucp_worker_create: ") + ucs_status_string(st));
    st = ucp_worker_get_efd(worker, &efd);
    wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (st != UCS_OK || wake < 0) {
      if (wake >= 0) ::close(wake);
      ucp_worker_destroy(worker);
      throw Error(std::string("hocc ucx: no event fd for the worker: ") + ucs_status_string(st));
    }
    idle_progress().add(this);
  }

  ~Impl() {
    idle_progress().remove(this);
    // flush what we sent (a peer may still be taking our last message), then close; bounded, as a peer may be gone
    close_eps(false);
    ucp_worker_destroy(worker);
    ::close(wake);
  }

  int prev() const { return (c.me + c.n - 1) % c.n; }
  int next() const { return (c.me + 1) % c.n; }
  // "rank 5 (the ring successor)": who a message goes to or comes from
  std::string role(int member) const {
    if (member == next()) return c.who(member) + " (the ring successor)";
    if (member == prev()) return c.who(member) + " (the ring predecessor)";
    return c.who(member);
  }

  void connect(std::vector<std::string> all) {
    if (!eps.empty()) throw Error("hocc ucx: this communicator is connected already");
    if (int(all.size()) != c.n)
      throw Error("hocc ucx: " + std::to_string(all.size()) + " addresses for " + std::to_string(c.n) + " members");
    addresses = std::move(all);
    eps.assign(size_t(c.n), nullptr);
    peers.resize(size_t(c.n));  // never resized again: the handlers hold pointers into it
    // the ring's neighbours and Bruck's partners (1, 2, 4, ... members either way): 2 log2(n) endpoints,
    // made now so that a partner's failure reaches this member's waits through its endpoint's error
    for (int d = 1; d < c.n; d *= 2) {
      endpoint((c.me + d) % c.n);
      endpoint((c.me - d + c.n) % c.n);
    }
  }

  ucp_ep_h endpoint(int member) {
    if (member == c.me || member < 0 || member >= c.n || eps.empty())
      throw Error("hocc ucx: no endpoint to member " + std::to_string(member) + " of " + std::to_string(c.n));
    ucp_ep_h& e = eps[size_t(member)];
    if (!e) e = connect_to(addresses[size_t(member)], member);
    return e;
  }

  static void on_error(void* arg, ucp_ep_h, ucs_status_t st) {
    auto* p = static_cast<Peer*>(arg);
    int none = -1;
    if (p->self->lost.compare_exchange_strong(none, p->member)) p->self->lost_status = st;
  }

  ucp_ep_h connect_to(const std::string& address, int member) {
    Peer& peer = peers[size_t(member)];
    peer = {this, member};
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                    UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.address = reinterpret_cast<const ucp_address_t*>(address.data());
    // PEER: a neighbour that dies or closes its endpoints fails this comm's waits instead of hanging them
    ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ep.err_handler.cb = on_error;
    ep.err_handler.arg = &peer;
    ucp_ep_h h = nullptr;
    ucs_status_t st = ucp_ep_create(worker, &ep, &h);
    if (st != UCS_OK)
      throw Error("hocc ucx: connecting to " + c.who(member) + " failed: " + ucs_status_string(st));
    return h;
  }

  // progress until a close or flush request ends (at most 1 s: a peer that is gone never answers)
  void settle(void* r) {
    if (!UCS_PTR_IS_PTR(r)) return;
    const int64_t until = now_ns() + 1'000'000'000;
    while (ucp_request_check_status(r) == UCS_INPROGRESS && now_ns() < until) ucp_worker_progress(worker);
    if (ucp_request_check_status(r) == UCS_INPROGRESS) ucp_request_cancel(worker, r);
    ucp_request_free(r);
  }

  // Close the endpoints, forced: a closing peer must not wait on this one's answer (UCX's flushed close in
  // peer error mode waits for the peer to progress, and two ranks closing comms in different orders would
  // each wait out the bound). Unless failing, flush first, so what we sent has left before the socket goes.
  void close_eps(bool failing) {
    for (ucp_ep_h& e : eps) {
      if (!e) continue;
      ucp_request_param_t p{};
      if (!failing && lost.load() < 0) settle(ucp_ep_flush_nbx(e, &p));
      p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      p.flags = UCP_EP_CLOSE_FLAG_FORCE;
      settle(ucp_ep_close_nbx(e, &p));
      e = nullptr;
    }
  }

  // IdleProgress: progress the worker if no op holds it. An abort() that came while this held op_mu could
  // not close the endpoints (it closes them only when no op holds the mutex): close them here instead.
  void progress_if_idle() {
    std::unique_lock<std::mutex> idle(op_mu, std::try_to_lock);
    // not connected yet: nothing of this comm's is in flight, and its own thread is about to connect
    if (!idle.owns_lock() || lost.load() >= 0 || eps.empty()) return;
    if (abort_flag.load(std::memory_order_acquire)) return close_eps(true);  // done already: eps are null
    // bounded: a worker that always has events (peers' connections being set up) must not keep op_mu from
    // the comm's own thread, whose connect() or op then waits on it
    for (int i = 0; i < kIdleProgressRounds && ucp_worker_progress(worker); ++i) {
    }
    if (abort_flag.load(std::memory_order_acquire)) close_eps(true);
  }

  void check_usable() {
    std::lock_guard<std::mutex> lk(mu);
    if (!broken.empty()) throw Error("hocc ucx: this communicator failed earlier (" + broken + "); not waiting again");
    if (!aborted.empty()) throw Error("hocc ucx: this communicator was aborted earlier (" + aborted + ")");
  }

  void post_send(Pending& o, int to, const void* buf, size_t bytes, uint64_t t) {
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_MEMORY_TYPE;
    p.cb.send = sent;
    p.user_data = &o;
    p.memory_type = UCS_MEMORY_TYPE_HOST;  // CPU buffers: no memory-type detection per message
    o = Pending{};
    o.done = false;
    void* r = ucp_tag_send_nbx(endpoint(to), buf, bytes, t, &p);
    started(o, r, "sending to " + role(to));
  }

  void post_recv(Pending& o, int from, void* buf, size_t bytes, uint64_t t, uint64_t mask) {
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_MEMORY_TYPE |
                     UCP_OP_ATTR_FIELD_RECV_INFO;
    p.cb.recv = received;
    p.user_data = &o;
    p.memory_type = UCS_MEMORY_TYPE_HOST;
    ucp_tag_recv_info_t info{};
    p.recv_info.tag_info = &info;  // filled when the message was already here
    o = Pending{};
    o.done = false;
    void* r = ucp_tag_recv_nbx(worker, buf, bytes, t, mask, &p);
    if (!UCS_PTR_IS_PTR(r) && UCS_PTR_STATUS(r) == UCS_OK) o.length = info.length;
    started(o, r, "receiving from " + role(from));
  }

  void started(Pending& o, void* r, const std::string& what) {
    if (UCS_PTR_IS_PTR(r)) {
      o.req = r;
      return;
    }
    o.done = true;
    o.status = UCS_PTR_STATUS(r);
    if (o.status != UCS_OK) fail(what + " failed: " + ucs_status_string(o.status));
  }

  // one op's end: its request freed, its status checked
  void finish(Pending& o, const std::string& what) {
    if (o.req) {
      ucp_request_free(o.req);
      o.req = nullptr;
    }
    if (o.status != UCS_OK) {
      if (o.status == UCS_ERR_MESSAGE_TRUNCATED)
        fail(what + ": a message larger than expected came (is that rank in another call?)", true);
      fail(what + " failed: " + ucs_status_string(o.status));
    }
  }

  // Wait on the calling thread until `o` is done: progress the worker for up to
  // spin_ns, then sleep on its event fd (and abort()'s), waking at least every
  // 100 ms; a failed neighbour, an abort or the timeout end the wait.
  void wait(Pending& o, const std::string& what) {
    if (o.done) return finish(o, what);
    const int64_t start = now_ns(), spin_until = start + spin_ns;
    const int64_t deadline = start + int64_t(timeout_s * 1e9);
    for (;;) {
      ++progressed;
      while (ucp_worker_progress(worker)) ++progressed;
      if (o.done) return finish(o, what);
      if (abort_flag.load(std::memory_order_acquire)) fail("", false);
      const int who = lost.load();
      if (who >= 0)
        fail(what + ": the connection to " + c.who(who) + " failed (" + ucs_status_string(lost_status) +
             "): it died, or failed and closed its side");
      const int64_t now = now_ns();
      if (now > deadline)
        fail(what + ": timed out after " + seconds(timeout_s) + " (that rank stopped, hung, or is in another call?)");
      if (now < spin_until) {  // a runnable peer gets the core; with none, this returns at once
        sched_yield();
        continue;
      }
      const ucs_status_t st = ucp_worker_arm(worker);
      if (st == UCS_ERR_BUSY) continue;  // events came in since the last progress
      if (st != UCS_OK) fail(std::string("ucp_worker_arm: ") + ucs_status_string(st));
      pollfd fds[2] = {{efd, POLLIN, 0}, {wake, POLLIN, 0}};
      ++slept;
      ::poll(fds, 2, int(std::min<int64_t>(100, (deadline - now) / 1000000 + 1)));
    }
  }

  // A failure: cancel what is in flight, close the endpoints (forced: the
  // neighbours' waits end too), and throw. The comm stays failed.
  [[noreturn]] void fail(const std::string& why, bool mismatch = false) {
    std::string aborted_why;
    {
      std::lock_guard<std::mutex> lk(mu);
      aborted_why = aborted;
      if (broken.empty()) broken = why.empty() ? "aborted: " + aborted_why : why;
    }
    for (Pending* o : {&data_recv, &check_recv, &data_send, &check_send})
      if (!o->done && o->req) ucp_request_cancel(worker, o->req);
    close_eps(true);
    const int64_t until = now_ns() + 1'000'000'000;
    for (Pending* o : {&data_recv, &check_recv, &data_send, &check_send}) {
      while (!o->done && now_ns() < until) ucp_worker_progress(worker);
      if (o->req && o->done) ucp_request_free(o->req);
      o->req = nullptr;
    }
    std::string where = "hocc ucx: a ring step among ranks [" + list() + "]";
    if (!aborted_why.empty() && !mismatch) throw Error(where + " was aborted: " + aborted_why);
    if (mismatch) throw MismatchError(where + ": " + why);
    throw Error(where + ", " + why);
  }

  std::string list() const {
    std::string s;
    for (int i = 0; i < c.n; ++i) s += (i ? "," : "") + (i < int(c.ranks.size()) ? std::to_string(c.ranks[i]) : "?");
    return s;
  }

  // a step: send to member `to` while receiving from member `from` (the ring's: next() and prev())
  void exchange(int to, const char* send, size_t send_n, int from, char* recv, size_t recv_n, DType t, RedOp op,
                const Lane& lane) {
    std::lock_guard<std::mutex> busy(op_mu);
    if (abort_flag.load()) fail("", false);
    check_usable();
    const CallId* call = c.call;
    if (call && call->seq != cur_seq) cur_seq = call->seq, step = 0;
    const uint64_t which = call ? (call->seq & 0xfffff) << 24 | (step & 0xffffff) : step;
    ++step;
    // the call check, at the call's first message here: our id to `to`, `from`'s to us (each member hears
    // one other, and a call's first step is a ring's, so every member is checked around the ring)
    const bool checking = call && call->seq != agreed;
    const std::string waiting = "waiting for " + role(from);
    const size_t es = dtype_size(t), send_b = send_n * es, recv_b = recv_n * es;
    bool data_sent = false;  // with the call id
    if (checking) {
      mine = *call;
      data_sent = send_n && send_b <= kWithCheck;
      check_out.resize(sizeof mine + (data_sent ? send_b : 0));
      std::memcpy(check_out.data(), &mine, sizeof mine);
      if (data_sent) std::memcpy(check_out.data() + sizeof mine, send, send_b);
      post_send(check_send, to, check_out.data(), check_out.size(), tag(kCheck, c.me, 0));
      // room for any predecessor's check, its data included: one in another call is still heard out
      check_in.resize(sizeof(CallId) + kWithCheck);
      post_recv(check_recv, from, check_in.data(), check_in.size(), tag(kCheck, from, 0), kKindSender);
    }
    // our data may leave at once: the successor takes it only once it has checked our call id
    if (send_n && !data_sent) post_send(data_send, to, send, send_b, tag(kData, c.me, which));
    size_t data_came = 0;  // with the predecessor's call id
    if (checking) {
      wait(check_recv, waiting + "'s call check");
      theirs = CallId{};
      theirs.magic = 0;  // a message too short to hold an id: it differs in every field
      if (check_recv.length >= sizeof theirs) std::memcpy(&theirs, check_in.data(), sizeof theirs);
      const std::string d = differences(mine, theirs);
      if (!d.empty())
        fail("the ranks disagree on this call: " + role(from) + " is in " +
             describe(theirs) + ", this rank in " + describe(mine) + ": " + d +
             ". Every rank must make the same collective calls in the same order with the same sizes, dtypes "
             "and ops (HOCC_CHECK=1 compares every rank's call before any byte moves)", true);
      agreed = mine.seq;
      data_came = check_recv.length - sizeof theirs;
    }
    // a reduction receives beside, then reduces into place (not in Comm::scratch: the rings' reduce_scatter_out
    // holds its region there)
    char* into = op != RedOp::none && recv_n ? landing.at_least(recv_b, *lane.dev) : recv;
    if (data_came != 0 || (recv_n && !checking) || (recv_n && recv_b > kWithCheck)) {
      if (data_came == 0) {
        post_recv(data_recv, from, into, recv_b, tag(kData, from, which), ~uint64_t(0));
        wait(data_recv, waiting);
        data_came = data_recv.length;
      } else if (data_came == recv_b) {
        std::memcpy(into, check_in.data() + sizeof(CallId), recv_b);
      }
      if (data_came != recv_b)
        fail(waiting + ": " + std::to_string(data_came) + " bytes came, " + std::to_string(recv_b) +
             " were expected (is that rank in another call?)", true);
    } else if (recv_n) {  // checked, and small: the data came with the id, or it is missing
      fail(waiting + ": its call id came without the " + std::to_string(recv_b) + " bytes expected with it (is that "
           "rank in another call?)", true);
    }
    c.recv_done_ns = wall_ns();
    if (send_n && !data_sent) wait(data_send, "sending to " + role(to));
    if (checking) wait(check_send, "sending the call check to " + c.who(to));
    if (into != recv) lane.dev->reduce(recv, into, recv_n, t, op, lane.stream);
  }

  void abort(const std::string& why) {
    {
      std::lock_guard<std::mutex> lk(mu);
      if (aborted.empty()) aborted = why.empty() ? "aborted" : why;
    }
    abort_flag.store(true, std::memory_order_release);
    const uint64_t one = 1;
    if (::write(wake, &one, sizeof one) < 0) {}  // a full counter is awake already
    // no op in flight: close the endpoints here, so the neighbours' waits end now
    std::unique_lock<std::mutex> idle(op_mu, std::try_to_lock);
    if (idle.owns_lock()) close_eps(true);
  }
};

void IdleProgress::add(UcxComm::Impl* c) {
  std::lock_guard<std::mutex> lk(mu);
  comms.insert(c);
  if (!started) {
    started = true;
    std::thread([this] { loop(); }).detach();
  }
}

void IdleProgress::loop() {
  for (;;) {
    std::this_thread::sleep_for(kIdleProgress);
    std::lock_guard<std::mutex> lk(mu);
    for (UcxComm::Impl* c : comms) c->progress_if_idle();
  }
}

UcxComm::UcxComm(int me, int n, double timeout_s, double spin_us) : Comm(me, n) {
  if (n < 1 || me < 0 || me >= n) throw Error("hocc ucx: member " + std::to_string(me) + " of " + std::to_string(n));
  impl_ = std::make_unique<Impl>(*this, timeout_s, spin_us);
}

UcxComm::~UcxComm() = default;

std::string UcxComm::address() const {
  ucp_address_t* a = nullptr;
  size_t len = 0;
  ucs_status_t st = ucp_worker_get_address(impl_->worker, &a, &len);
  if (st != UCS_OK) throw Error(std::string("hocc ucx: ucp_worker_get_address: ") + ucs_status_string(st));
  std::string s(reinterpret_cast<const char*>(a), len);
  ucp_worker_release_address(impl_->worker, a);
  return s;
}

void UcxComm::connect(std::vector<std::string> addresses) {
  if (n == 1) return;
  std::lock_guard<std::mutex> busy(impl_->op_mu);
  impl_->connect(std::move(addresses));
}

void UcxComm::exchange(const char* send, size_t send_n, char* recv, size_t recv_n, DType t, RedOp op,
                       const Lane& lane) {
  impl_->exchange(impl_->next(), send, send_n, impl_->prev(), recv, recv_n, t, op, lane);
}

void UcxComm::exchange_with(int to, const char* send, size_t send_n, int from, char* recv, size_t recv_n, DType t,
                            RedOp op, const Lane& lane) {
  impl_->exchange(to, send, send_n, from, recv, recv_n, t, op, lane);
}

void UcxComm::all_reduce(const char* src, char* dst, size_t count, DType t, RedOp op, const Lane& lane) {
  const size_t bytes = count * dtype_size(t);
  if (n == 1 || size_t(n) * bytes > kTinyGather) return ring_all_reduce(*this, src, dst, count, t, op, lane);
  char* all = impl_->gathered.at_least(size_t(n) * bytes, *lane.dev);
  bruck_all_gather(*this, src, all, count, t, lane);
  copy_in(all, dst, count, t, lane);
  for (int q = 1; q < n; ++q) lane.dev->reduce(dst, all + size_t(q) * bytes, count, t, op, lane.stream);
}

void UcxComm::all_gather(const char* src, char* dst, size_t seg, DType t, const Lane& lane) {
  if (size_t(n) * seg * dtype_size(t) > kTinyGather) return ring_all_gather(*this, src, dst, seg, t, lane);
  bruck_all_gather(*this, src, dst, seg, t, lane);
}

void UcxComm::reduce_scatter_out(const char* src, char* out, size_t seg, DType t, RedOp op, const Lane& lane) {
  ring_reduce_scatter_out(*this, src, out, seg, t, op, lane);
}

void UcxComm::abort(const std::string& why) { impl_->abort(why); }

bool UcxComm::broken() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  return !impl_->broken.empty();
}
size_t UcxComm::held_bytes() const {
  return scratch.size() + impl_->landing.size() + impl_->gathered.size();
}
uint64_t UcxComm::progress_calls() const { return impl_->progressed; }
uint64_t UcxComm::sleeps() const { return impl_->slept; }

#endif

}  // namespace hocc
