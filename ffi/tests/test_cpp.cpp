// The C++ wrapper (kvfence.hpp): RAII of Table, Release and TransferGuard, Result values
// and the exception of .value(), the C++20 span overloads (this file is built as C++17 and
// as C++20 by ffi/ci.sh). Leaks and double frees would be caught by the ASan and valgrind
// runs of this same binary.
#include "kvfence.hpp"

#include <cstdio>
#include <cstring>
#include <thread>

#include "check.hpp"

using namespace std::chrono_literals;

static void table_and_results() {
    auto bad = kvfence::Table::create(kvfence::Table::gate(0));
    CHECK(!bad && bad.status() == KVFENCE_INVALID_CONFIG);
    CHECK(bad.message().find("rooms must be in") != std::string::npos);
    bool threw = false;
    try {
        (void)bad.value();
    } catch (const kvfence::Error &e) {
        threw = e.status() == KVFENCE_INVALID_CONFIG &&
                std::strstr(e.what(), "invalid kvfence config") != nullptr;
    }
    CHECK(threw);

    kvfence::Table t = kvfence::Table::create(kvfence::Table::gate(8)).value();
    const uint32_t writers[] = {0, 1};
    const uint32_t pages[] = {7, 8, 9};
    kvfence::Handle h = t.open_gate(writers, 2, 42, pages, 3).value();
    CHECK(t.phase(h).value() == KVFENCE_PHASE_OWNED);
    CHECK(t.pages_of(h).value().size() == 3);
    const uint32_t more[] = {10};
    CHECK(t.grow_gate(h, more, 1).ok());
    CHECK(t.pages_of(h).value().back() == 10);

    // Move the table: the moved-from one owns nothing, the new one works.
    kvfence::Table t2 = std::move(t);
    CHECK(t.raw() == nullptr);
    auto a = t2.abort(h).value();
    CHECK(a.fanout_size() == 2 && a.fanout()[0] == 0 && a.fanout()[1] == 1 && a.release.empty());
    auto again = t2.abort(h);
    CHECK(again.status() == KVFENCE_ALREADY_ABORTED);
    CHECK(t2.quiesce(h, 0).value().what == KVFENCE_QUIESCE_RECORDED);
    CHECK(t2.quiesce(h, 0).value().what == KVFENCE_QUIESCE_DUPLICATE);
    kvfence::Quiesced q = t2.quiesce(h, 1).value();
    CHECK(q.what == KVFENCE_QUIESCE_RELEASED && q.release.token() == 42);
    CHECK(q.release.size() == 4 && q.release.pages()[3] == 10 && !q.release.quarantined());
    uint32_t sum = 0;
    for (uint32_t p : q.release)
        sum += p;
    CHECK(sum == 7 + 8 + 9 + 10);
    CHECK(q.release.handle() == h);
    // A late ACK: a value, not an exception.
    auto late = t2.quiesce(h, 1);
    CHECK(!late.ok() && late.status() == KVFENCE_STALE_HANDLE);
    CHECK(t2.stats().value().stale_refused == 1);
}

// The guard's destructor ends the transfer as FAILED: the room stays held until the peer is
// fenced, and that release goes to the queue (nobody could take it from the destructor).
static void guard_destructor_fails_the_transfer() {
    kvfence::Table t = kvfence::Table::create(kvfence::Table::gate(8)).value();
    const uint32_t pages[] = {1, 2};
    kvfence::Handle h = t.open_gate(nullptr, 0, 5, pages, 2).value();
    {
        kvfence::TransferGuard g = t.begin(h, 3).value();
        CHECK(g.active());
        kvfence::TransferGuard moved = std::move(g); // the moved-from guard does nothing
        CHECK(!g.active() && moved.active());
        // leaves scope without complete(): failed
    }
    auto st = t.room_status(h).value();
    CHECK(st.transfers == 1 && st.failed == 1);
    CHECK(t.finish(h).value().empty()); // the failed transfer still holds it
    CHECK(!t.wait_released(h, 1ms).value()); // timed out: false, not an error
    kvfence::Fenced f = t.fence_rank(3).value();
    CHECK(f.summary.failed_ended == 1 && f.released.size() == 1);
    CHECK(f.released[0].reason() == KVFENCE_REASON_FINISHED && f.released[0].token() == 5);
    CHECK(t.wait_released(h, 1ms).value());
    CHECK(t.readmit_rank(3).value());

    // A destructor whose end releases the room (peer fenced already): into the queue.
    h = t.open_gate(nullptr, 0, 6, pages, 2).value();
    {
        kvfence::TransferGuard g = t.begin(h, 4).value();
        CHECK(t.fence_rank(4).value().released.empty());
        CHECK(t.finish(h).value().empty());
    }
    CHECK(t.queued_releases() == 1);
    std::vector<kvfence::Release> out;
    CHECK(t.drain_released(out) == 1 && out[0].token() == 6);
    CHECK(t.readmit_rank(4).value());

    // finish_drained(): a successful transfer's end; the release comes back from the call.
    const uint32_t writers[] = {2, 3};
    h = t.open_gate(writers, 2, 9, pages, 2).value();
    kvfence::Release done = t.finish_drained(h).value();
    CHECK(done.token() == 9 && done.reason() == KVFENCE_REASON_FINISHED);
    CHECK(t.finish_drained(h).status() == KVFENCE_STALE_HANDLE);

    // complete(): the release comes back from the call; a second end is refused.
    h = t.open_gate(nullptr, 0, 7, pages, 2).value();
    kvfence::TransferGuard g = t.begin(h).value();
    CHECK(t.finish(h).value().empty());
    kvfence::Release r = g.complete().value();
    CHECK(r.token() == 7 && r.reason() == KVFENCE_REASON_FINISHED);
    CHECK(!g.active() && g.complete().status() == KVFENCE_INVALID_TOKEN);
    CHECK(t.begin(h).status() == KVFENCE_STALE_HANDLE);
    CHECK(t.wait_idle(10ms).value());
}

static void pool_queue_quarantine_threads() {
    auto config = kvfence::Table::pool(4, 16);
    config.release_queue = 1;
    kvfence::Table t = kvfence::Table::create(config).value();
    std::vector<uint32_t> pages;
    const uint32_t writers[] = {2};
    kvfence::Handle h = t.open(writers, 1, 4, pages).value();
    CHECK(pages.size() == 4);
    CHECK(t.grow(h, 2, pages).ok() && pages.size() == 6);
    CHECK(t.grow(h, 11, pages).status() == KVFENCE_POOL_EXHAUSTED && pages.size() == 6);
    CHECK(t.grow(h, 17, pages).status() == KVFENCE_TOO_MANY_PAGES && pages.size() == 6);
    // An ACK thread and a waiter.
    CHECK(t.abort(h).ok());
    std::thread ack([&] { (void)t.quiesce(h, 2); });
    ack.join();
    CHECK(t.pop_released().value().size() == 6);
    CHECK(t.wait_released(h).value());
    CHECK(t.stats().value().pages.free == 16);

    h = t.open(writers, 1, 3, pages).value();
    auto guard = t.begin(h, 2).value();
    CHECK(guard.fail().value().empty());
    CHECK(t.abort(h).ok() && t.quiesce(h, 2).ok());
    CHECK(t.quarantine(h).value().empty()); // queue mode: to the queue
    kvfence::Release q = t.pop_released().value();
    CHECK(q.quarantined() && q.size() == 3);
    CHECK(t.stats().value().quarantined_pages == 3);
}

#ifdef KVFENCE_HPP_SPAN
static void spans() {
    kvfence::Table t = kvfence::Table::create(kvfence::Table::gate(4)).value();
    std::vector<uint32_t> writers{1, 2}, pages{5, 6, 7};
    kvfence::Handle h = t.open_gate(std::span<const uint32_t>(writers), 9, pages).value();
    CHECK(t.grow_gate(h, std::span<const uint32_t>(pages).subspan(0, 1)).ok());
    auto a = t.abort(h).value();
    (void)t.quiesce(h, 1);
    kvfence::Release r = t.quiesce(h, 2).value().release;
    CHECK(r.span().size() == 4 && r.span()[3] == 5);
    std::vector<uint32_t> pool_pages;
    CHECK(t.open(std::span<const uint32_t>(writers), 1, pool_pages).status() == KVFENCE_WRONG_MODE);
    std::puts("test_cpp: C++20 span overloads tested");
}
#endif

int main() {
    table_and_results();
    guard_destructor_fails_the_transfer();
    pool_queue_quarantine_threads();
#ifdef KVFENCE_HPP_SPAN
    spans();
#endif
    std::printf("test_cpp (C++%ld): %d passed, %d failed\n", __cplusplus / 100 % 100, passed, failed);
    return failed == 0 ? 0 : 1;
}
