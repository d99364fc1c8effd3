// The engine's call queue (executor/call_queue.h) under the sanitizers: items
// run once each, in order, with their own tickets; waits from other threads
// see them done; watch() calls back; close() runs what is queued; cancel()
// from another thread or from the worker drops what has not begun and never
// loses or repeats the item that runs; a queue destroyed by its own item lets
// that item end; an item run on its caller's thread (run_here) keeps the order, and so does a queued
// item its waiter runs (run_queued_here) whichever thread wins it.
#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "core/types.h"
#include "executor/call_queue.h"
#include "tests/check.h"

using hocc::CallQueue;

namespace hocc_test {
namespace {

void order_and_waits() {
  std::vector<uint64_t> ran;  // only the worker writes it
  std::atomic<uint64_t> watched_done{0};
  CallQueue q([&](uint64_t done) { watched_done.store(done); });
  const uint64_t n = 2000;
  std::vector<std::thread> waiters;
  std::atomic<int> bad_waits{0};
  for (int w = 0; w < 4; ++w)
    waiters.emplace_back([&, w] {
      for (uint64_t t = uint64_t(w) * 37; t < n; t += 97) {
        while (q.pushed() <= t) std::this_thread::yield();
        if (q.wait(t) != CallQueue::kDone || q.completed() <= t) ++bad_waits;
      }
    });
  for (uint64_t i = 0; i < n; ++i) {
    const uint64_t got = q.push([&ran, i](uint64_t ticket) { ran.push_back(ticket == i ? i : ~i); });
    EXPECT(got == i, "push returns tickets in order: " + std::to_string(got) + " for " + std::to_string(i));
  }
  EXPECT(q.watch(n - 1) || q.completed() == n, "watch of a pending ticket is taken");
  EXPECT(q.wait(n - 1) == CallQueue::kDone, "the last item ends");
  for (auto& t : waiters) t.join();
  EXPECT(bad_waits.load() == 0, std::to_string(bad_waits.load()) + " waits from other threads returned early");
  EXPECT(ran.size() == n, "every item ran once: " + std::to_string(ran.size()));
  bool in_order = true;
  for (uint64_t i = 0; i < ran.size(); ++i) in_order = in_order && ran[i] == i;
  EXPECT(in_order, "items ran in order, each with its own ticket");
  for (int i = 0; i < 200 && watched_done.load() < n; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT(watched_done.load() == n, "on_done told of the watched ticket");
  EXPECT(!q.watch(0), "watch of a done ticket says so");
  EXPECT(q.idle() && q.busy_for() == 0.0, "an empty queue is idle");
}

void timeouts_and_busy() {
  std::atomic<bool> release{false};
  CallQueue q;
  const uint64_t t = q.push([&](uint64_t) {
    while (!release.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  EXPECT(q.wait(t, 0.02) == CallQueue::kTimedOut, "a wait with a timeout returns when the item is still running");
  EXPECT(q.busy_for() > 0.0 && !q.idle(), "a running item shows as busy");
  release.store(true);
  EXPECT(q.wait(t, 5.0) == CallQueue::kDone, "and kDone once it ended");
}

void close_drains() {
  std::atomic<int> ran{0};
  CallQueue q;
  for (int i = 0; i < 100; ++i)
    q.push([&](uint64_t) {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
      ++ran;
    });
  q.close();
  EXPECT(ran.load() == 100, "close() runs every queued item first: " + std::to_string(ran.load()));
  bool refused = false;
  try {
    q.push([](uint64_t) {});
  } catch (const hocc::Error& e) {
    refused = std::string(e.what()).find("closed") != std::string::npos;
  }
  EXPECT(refused, "a closed queue refuses new items, saying so");
}

void cancel_drops(bool from_worker) {
  std::atomic<bool> release{false};
  std::atomic<int> ran{0};
  CallQueue q;
  const uint64_t first = q.push([&](uint64_t) {
    if (from_worker) {
      while (q.pushed() < 11) std::this_thread::yield();
      EXPECT(q.cancel("stopped by its own item") == 1, "cancel from the worker drops from ticket 1");
    }
    while (!release.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    ++ran;
  });
  std::vector<uint64_t> later;
  for (int i = 0; i < 10; ++i) later.push_back(q.push([&](uint64_t) { ran += 100; }));
  std::atomic<int> dropped_waits{0};
  std::thread waiter([&] {
    for (uint64_t t : later) dropped_waits += q.wait(t) == CallQueue::kDropped;
  });
  if (!from_worker) {
    while (q.busy_for() == 0.0) std::this_thread::yield();
    EXPECT(q.cancel("aborted for the test") == 1, "cancel drops from the first item not begun");
  }
  waiter.join();
  EXPECT(dropped_waits.load() == 10, "waits on dropped items return kDropped: " + std::to_string(dropped_waits.load()));
  EXPECT(q.dropped(later.front()) && !q.dropped(first), "dropped() names the dropped tickets only");
  release.store(true);
  EXPECT(q.wait(first) == CallQueue::kDone, "the running item still ends as done");
  q.join();
  EXPECT(ran.load() == 1, "the running item ran once, no dropped one ran: " + std::to_string(ran.load()));
  EXPECT(!q.why_stopped().empty(), "the queue says why it stopped");
}

void destroy_with_items() {
  std::atomic<int> ran{0};
  {
    CallQueue q;
    for (int i = 0; i < 50; ++i) q.push([&](uint64_t) { ++ran; });
  }  // the destructor drops what has not begun and joins
  EXPECT(ran.load() <= 50, "a destroyed queue ran no item twice");
}

void destroyed_by_its_item() {
  std::atomic<bool> finished{false};
  auto* q = new CallQueue([](uint64_t) {});
  q->push([&, q](uint64_t) {
    delete q;  // the last owner let go from inside an item (a Python object freed on the worker)
    finished.store(true);
  });
  for (int i = 0; i < 2000 && !finished.load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT(finished.load(), "an item that destroys its own queue runs to its end");
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the detached worker ends by itself
}

void joins_and_thread_ids() {
  std::atomic<bool> release{false};
  CallQueue q;
  q.push([&](uint64_t) {
    while (!release.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  q.cancel("stopped for the test");
  std::atomic<int> joined{0};
  std::thread a([&] { q.join(); ++joined; }), b([&] { q.join(); ++joined; });
  std::this_thread::sleep_for(std::chrono::milliseconds(10));
  release.store(true);
  a.join();
  b.join();
  EXPECT(joined.load() == 2, "two threads joining one queue at once both return");
  bool on_worker = true;
  std::thread([&] { on_worker = q.on_worker(); }).join();  // may reuse the ended worker's thread id
  EXPECT(!on_worker, "once the worker has ended no thread is its worker");
}

// run_here: a sync call's item on its caller's thread, only when nothing is queued or running;
// meanwhile the worker starts nothing pushed behind it; its exception passes, counted done; join waits.
void runs_here() {
  CallQueue q;
  const auto me = std::this_thread::get_id();
  std::thread::id ran_on;
  uint64_t got = 99;
  bool busy = false;
  EXPECT(q.run_here([&](uint64_t t) { ran_on = std::this_thread::get_id(), got = t, busy = q.busy_for() > 0.0; }),
         "an idle queue runs the item here");
  EXPECT(ran_on == me && got == 0 && busy && q.completed() == 1 && q.idle(),
         "on the caller's thread, with ticket 0, busy while it ran, done after");

  std::atomic<bool> release{false}, started{false};
  const uint64_t slow = q.push([&](uint64_t) {
    started.store(true);
    while (!release.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  while (!started.load()) std::this_thread::yield();
  bool ran = false;
  EXPECT(!q.run_here([&](uint64_t) { ran = true; }) && !ran && q.pushed() == slow + 1,
         "a busy queue leaves the item to push (nothing ran, no ticket taken)");
  release.store(true);
  EXPECT(q.wait(slow) == CallQueue::kDone, "the worker's item ends");

  std::vector<int> order;  // written by the item here, then by the worker's, never at once
  std::atomic<bool> inside{false}, pushed{false};
  std::thread pusher([&] {
    while (!inside.load()) std::this_thread::yield();
    q.push([&](uint64_t) { order.push_back(2); });
    pushed.store(true);
  });
  EXPECT(q.run_here([&](uint64_t) {
    inside.store(true);
    while (!pushed.load()) std::this_thread::yield();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the worker would start now if it could
    order.push_back(1);
  }), "run here while another thread pushes");
  pusher.join();
  EXPECT(q.wait(q.pushed() - 1) == CallQueue::kDone, "the pushed item runs after");
  EXPECT(order == std::vector<int>({1, 2}), "an item pushed behind one run here starts after it ends");

  bool passed = false;
  try {
    q.run_here([](uint64_t) { throw hocc::Error("planted"); });
  } catch (const hocc::Error& e) {
    passed = std::string(e.what()) == "planted";
  }
  EXPECT(passed && q.idle(), "an item run here that throws: the error passes through, the item counted done");

  std::atomic<bool> joined{false};
  std::thread runner([&] {
    q.run_here([&](uint64_t) {
      inside.store(false);
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
      EXPECT(!joined.load(), "join waits for an item run here");
    });
  });
  while (q.idle()) std::this_thread::yield();
  q.cancel("stopped for the test");
  q.join();
  joined.store(true);
  runner.join();
  EXPECT(!q.run_here([](uint64_t) {}), "a stopped queue runs nothing here (push says why)");
}

void runs_queued_here() {
  CallQueue q;
  const auto me = std::this_thread::get_id();
  std::atomic<bool> release{false}, started{false};
  const uint64_t slow = q.push([&](uint64_t) {
    started.store(true);
    while (!release.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  while (!started.load()) std::this_thread::yield();
  int ran = 0;
  const uint64_t next = q.push([&](uint64_t) { ++ran; });
  EXPECT(!q.run_queued_here(next) && ran == 0, "an item behind a running one is left to the worker");
  EXPECT(!q.run_queued_here(slow), "an item the worker has begun is not run again");
  release.store(true);
  EXPECT(q.wait(next) == CallQueue::kDone && ran == 1, "both end, each once");

  // a waiter and the worker race for each item: whoever takes it, it runs once, in order
  std::vector<uint64_t> order;  // written by one thread at a time: the queue's lock orders the hand-overs
  std::vector<std::thread::id> where;
  int here = 0;
  for (int i = 0; i < 300; ++i) {
    const uint64_t t = q.push([&](uint64_t ticket) {
      order.push_back(ticket);
      where.push_back(std::this_thread::get_id());
    });
    const bool stolen = q.run_queued_here(t);
    EXPECT(q.wait(t) == CallQueue::kDone, "the raced item ends");
    if (stolen) {
      ++here;
      EXPECT(where.back() == me, "an item run here runs on the waiter's thread");
    }
  }
  bool in_order = order.size() == 300;
  for (size_t i = 1; in_order && i < order.size(); ++i) in_order = order[i] == order[i - 1] + 1;
  EXPECT(in_order, "every raced item ran once, in ticket order");
  std::printf("    run_queued_here: %d of 300 raced items ran on the waiter\n", here);

  q.cancel("stopped for the test");
  q.join();
  EXPECT(!q.run_queued_here(q.pushed()), "a stopped queue runs nothing here");
}

}  // namespace

void call_queue_checks() {
  const auto t0 = Clock::now();
  order_and_waits();
  timeouts_and_busy();
  close_drains();
  cancel_drops(false);
  cancel_drops(true);
  destroy_with_items();
  destroyed_by_its_item();
  joins_and_thread_ids();
  runs_here();
  runs_queued_here();
  std::printf("  call queue: order, waits from threads, watch, close, cancel, run here, run queued here (%.1f s)\n",
              since(t0));
}

}  // namespace hocc_test
