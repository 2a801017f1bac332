// kvfence.hpp: a header-only C++17 wrapper over kvfence.h (the C ABI of kvfence).
//
//   kvfence::Table         RAII owner of a kvfence_table* (move-only)
//   kvfence::TransferGuard a transfer in flight (move-only); its destructor ends the
//                          transfer as FAILED unless complete() or fail() was called: the
//                          room then stays held until the peer is fenced or the room is
//                          quarantined (the Rust rule: a dropped guard is a failure)
//   kvfence::Release       RAII owner of a release; one destroyed before its contents
//                          (token, pages) were read goes back to the release queue
//                          (kvfence_release_requeue): a release is never dropped silently
//   kvfence::Result<T>     the outcome of every call: a value or a kvfence_status (its
//                          message is formatted only when asked for)
//
// Errors are values, not exceptions: every operation returns a Result<T> (modelled on
// C++23's std::expected). Why: the refusals kvfence exists to make (a late ACK's
// KVFENCE_STALE_HANDLE, a queued intent's KVFENCE_ROOM_CLOSED) are normal control flow in
// a running engine, on its hot path, many times a second; throwing for them would cost an
// unwind each and push callers into try/catch for non-errors. Result also works in code
// built with -fno-exceptions. Code that prefers exceptions calls .value(), which throws
// kvfence::Error (a std::runtime_error carrying the status) on failure; without exception
// support .value() on a failed Result prints the error and calls std::abort() (a
// precondition violation of the caller, like dereferencing an empty std::optional).
//
// Page lists are (pointer, length) pairs; under C++20 every such overload also takes a
// std::span<const uint32_t>. Thread-safety is the C ABI's: a Table may be used by many
// threads at once (not moved or destroyed meanwhile); Results, Releases and guards are
// owned by one thread at a time.
#ifndef KVFENCE_HPP
#define KVFENCE_HPP

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#if __cplusplus >= 202002L && __has_include(<span>)
#include <span>
#define KVFENCE_HPP_SPAN 1
#endif

#include "kvfence.h"

// Handle equality (the C types live in the global namespace, so do their operators).
inline bool operator==(const kvfence_handle &a, const kvfence_handle &b) {
    return kvfence_handle_eq(a, b);
}
inline bool operator!=(const kvfence_handle &a, const kvfence_handle &b) {
    return !kvfence_handle_eq(a, b);
}

namespace kvfence {

// The last failure's message on this thread (kvfence_last_error).
inline std::string last_error() {
    char buf[512];
    size_t len = 0;
    if (kvfence_last_error(buf, sizeof buf, &len) != KVFENCE_OK)
        return "kvfence_last_error failed";
    return std::string(buf);
}

// What .value() throws on a failed Result (when exceptions are enabled).
class Error : public std::runtime_error {
  public:
    Error(kvfence_status status, const std::string &detail)
        : std::runtime_error(std::string(kvfence_status_str(status)) + ": " + detail),
          status_(status) {}
    kvfence_status status() const noexcept { return status_; }

  private:
    kvfence_status status_;
};

namespace detail {
// The message of a failure whose kvfence_last_error_id() was `id`: kvfence_last_error's if
// it still describes that failure (nothing failed on this thread since), else the status
// text alone.
inline std::string message_of(kvfence_status status, uint64_t id) {
    if (id != 0 && kvfence_last_error_id() == id)
        return last_error();
    return std::string(kvfence_status_str(status)) +
           " (details overwritten by a later failure on this thread)";
}

[[noreturn]] inline void fail_value(kvfence_status status, const std::string &detail) {
#if defined(__cpp_exceptions) || defined(__EXCEPTIONS)
    throw Error(status, detail);
#else
    std::fprintf(stderr, "kvfence: value() of a failed Result: %s: %s\n",
                 kvfence_status_str(status), detail.c_str());
    std::abort();
#endif
}
} // namespace detail

// A value of type T, or the kvfence_status (and message) of why there is none.
//
// A failure costs no formatting and no allocation: it keeps its status and the id of the
// failure (kvfence_last_error_id), and message() formats kvfence_last_error's details on
// first use (issue 40: formatting every refusal made a late ACK through the wrapper 6-7x
// the C call). Ask for message() on the failing thread before another kvfence call on it
// fails; later (or on another thread) it says the status and that the details are gone.
template <class T> class [[nodiscard]] Result {
  public:
    Result(T value) : status_(KVFENCE_OK), has_(true), id_(0) {
        new (&value_) T(std::move(value));
    }
    // A failure of the call just made on this thread (its details: kvfence_last_error).
    static Result failure(kvfence_status status) {
        return Result(status, kvfence_last_error_id());
    }
    static Result failure(kvfence_status status, std::string message) {
        Result r(status, 0);
        r.message_ = std::move(message);
        return r;
    }
    Result(Result &&o) noexcept(std::is_nothrow_move_constructible<T>::value)
        : status_(o.status_), has_(o.has_), id_(o.id_), message_(std::move(o.message_)) {
        if (has_)
            new (&value_) T(std::move(o.value_));
    }
    Result &operator=(Result &&o) noexcept(std::is_nothrow_move_constructible<T>::value) {
        if (this != &o) {
            reset();
            status_ = o.status_;
            has_ = o.has_;
            id_ = o.id_;
            message_ = std::move(o.message_);
            if (has_)
                new (&value_) T(std::move(o.value_));
        }
        return *this;
    }
    Result(const Result &) = delete;
    Result &operator=(const Result &) = delete;
    ~Result() { reset(); }

    bool ok() const noexcept { return has_; }
    explicit operator bool() const noexcept { return has_; }
    kvfence_status status() const noexcept { return status_; }
    // The failure's message, formatted on first use ("" on success).
    const std::string &message() const {
        if (!has_ && message_.empty())
            message_ = detail::message_of(status_, id_);
        return message_;
    }

    T &value() & {
        if (!has_)
            detail::fail_value(status_, message());
        return value_;
    }
    T &&value() && {
        if (!has_)
            detail::fail_value(status_, message());
        return std::move(value_);
    }
    T &operator*() & { return value(); }
    T *operator->() { return &value(); }

  private:
    Result(kvfence_status status, uint64_t id) noexcept
        : status_(status), has_(false), id_(id) {}
    void reset() {
        if (has_)
            value_.~T();
        has_ = false;
    }
    kvfence_status status_;
    bool has_;
    uint64_t id_;
    mutable std::string message_;
    union {
        T value_;
    };
};

// A call that returns nothing but its status.
template <> class [[nodiscard]] Result<void> {
  public:
    Result() noexcept : status_(KVFENCE_OK), id_(0) {}
    static Result failure(kvfence_status status) {
        return Result(status, kvfence_last_error_id());
    }
    bool ok() const noexcept { return status_ == KVFENCE_OK; }
    explicit operator bool() const noexcept { return ok(); }
    kvfence_status status() const noexcept { return status_; }
    const std::string &message() const {
        if (!ok() && message_.empty())
            message_ = detail::message_of(status_, id_);
        return message_;
    }
    void value() const {
        if (!ok())
            detail::fail_value(status_, message());
    }

  private:
    Result(kvfence_status status, uint64_t id) noexcept : status_(status), id_(id) {}
    kvfence_status status_;
    uint64_t id_;
    mutable std::string message_;
};

using Handle = kvfence_handle;
using Token = kvfence_token;

namespace detail {
// What a Table's releases keep of it: the C table, while it lives. A Release destroyed
// unread gives itself back to that table; once the Table is gone (table == nullptr) there
// is nowhere to give it back. Reference-counted (by the Table and by each non-empty
// Release), so a Release may outlive its Table safely.
struct Shared {
    std::atomic<kvfence_table *> table;
    std::atomic<size_t> refs;
};
inline Shared *acquire(Shared *s) noexcept {
    if (s)
        s->refs.fetch_add(1, std::memory_order_relaxed);
    return s;
}
inline void release_ref(Shared *s) noexcept {
    if (s && s->refs.fetch_sub(1, std::memory_order_acq_rel) == 1)
        delete s;
}
} // namespace detail

// A room's release (or none: empty()). Owns the release and its page array.
//
// A release must be acted on: gate mode, free pages() with the engine's allocator now
// (unless quarantined(): then never). A Release destroyed before anything of it was read
// (token(), handle(), pages(), size(), begin()/end(), span(), take()) is given back to its
// table's release queue (kvfence_release_requeue): the next Table::drain_released
// delivers it again, so `(void)guard.complete();` and `(void)t.finish(h);` lose nothing
// (issue 40). reason(), quarantined() and empty() do not count as reading it. discard()
// frees it on purpose (pool mode: its pages are back in the pool already). A Release may
// outlive its Table: then it is freed with a warning on stderr.
class [[nodiscard]] Release {
  public:
    Release() noexcept : r_(empty_release()), shared_(nullptr), read_(false) {}
    // A raw release (from the C API) taken over; its table is unknown, so it is freed on
    // destruction, never given back (the Table's own calls make Releases that are).
    explicit Release(const kvfence_release &raw) noexcept : Release(raw, nullptr) {}
    Release(Release &&o) noexcept : r_(o.r_), shared_(o.shared_), read_(o.read_) {
        o.r_ = empty_release();
        o.shared_ = nullptr;
    }
    Release &operator=(Release &&o) noexcept {
        if (this != &o) {
            dispose();
            r_ = o.r_;
            shared_ = o.shared_;
            read_ = o.read_;
            o.r_ = empty_release();
            o.shared_ = nullptr;
        }
        return *this;
    }
    Release(const Release &) = delete;
    Release &operator=(const Release &) = delete;
    ~Release() { dispose(); }

    bool empty() const noexcept { return r_.reason == KVFENCE_REASON_NONE; }
    explicit operator bool() const noexcept { return !empty(); }
    kvfence_reason reason() const noexcept { return r_.reason; }
    bool quarantined() const noexcept { return r_.reason == KVFENCE_REASON_QUARANTINED; }
    Handle handle() const noexcept { return read(), r_.handle; }
    uint64_t token() const noexcept { return read(), r_.token; }
    const uint32_t *pages() const noexcept { return read(), r_.pages; }
    size_t size() const noexcept { return read(), r_.pages_len; }
    const uint32_t *begin() const noexcept { return read(), r_.pages; }
    const uint32_t *end() const noexcept { return read(), r_.pages + r_.pages_len; }
#ifdef KVFENCE_HPP_SPAN
    std::span<const uint32_t> span() const noexcept { return read(), std::span<const uint32_t>{r_.pages, r_.pages_len}; }
#endif
    // Gives the raw release up (the caller frees it with kvfence_release_free, once).
    kvfence_release take() noexcept {
        kvfence_release r = r_;
        r_ = empty_release();
        detail::release_ref(shared_);
        shared_ = nullptr;
        return r;
    }
    // Frees the release without acting on it, on purpose (never given back).
    void discard() noexcept {
        kvfence_release_free(&r_);
        detail::release_ref(shared_);
        shared_ = nullptr;
    }

  private:
    friend class Table;
    friend class TransferGuard;
    // Taken over from a Table (`shared` counted here only if the release is not empty).
    Release(const kvfence_release &raw, detail::Shared *shared) noexcept
        : r_(raw), shared_(nullptr), read_(false) {
        if (!empty())
            shared_ = detail::acquire(shared);
    }
    void read() const noexcept { read_ = true; }
    void dispose() noexcept {
        if (!empty() && !read_) {
            kvfence_table *t = shared_ ? shared_->table.load(std::memory_order_acquire) : nullptr;
            if (t && kvfence_release_requeue(t, &r_) == KVFENCE_OK) {
                // Back in the queue: the struct is empty now.
            } else {
                std::fprintf(stderr,
                             "kvfence: a Release was destroyed unread and could not be given "
                             "back to its table (%s): token %llu, %zu pages\n",
                             t ? "out of memory" : "the table is gone",
                             static_cast<unsigned long long>(r_.token), r_.pages_len);
            }
        }
        kvfence_release_free(&r_);
        detail::release_ref(shared_);
        shared_ = nullptr;
    }
    static kvfence_release empty_release() noexcept {
        kvfence_release r{};
        r.reason = KVFENCE_REASON_NONE;
        return r;
    }
    kvfence_release r_;
    detail::Shared *shared_;
    mutable bool read_;
};

// What Table::quiesce did (and the release, if it performed one directly).
struct Quiesced {
    kvfence_quiesced what;
    Release release;
};

// What Table::abort did: the ranks to send ABORT to, and a release if nothing held the room.
struct Aborted {
    std::array<uint32_t, KVFENCE_MAX_WRITERS> fanout_buf;
    size_t fanout_len;
    Release release;
    const uint32_t *fanout() const noexcept { return fanout_buf.data(); }
    size_t fanout_size() const noexcept { return fanout_len; }
};

// What Table::fence_rank did.
struct Fenced {
    kvfence_fenced summary;
    std::vector<Release> released;
};

class TransferGuard;

// A kvfence room table (move-only RAII owner).
class Table {
  public:
    // Config helpers (change fields before create).
    static kvfence_config gate(uint64_t rooms) { return kvfence_config_gate(rooms); }
    static kvfence_config pool(uint64_t rooms, uint64_t pages) {
        return kvfence_config_pool(rooms, pages);
    }

    static Result<Table> create(const kvfence_config &config) {
        kvfence_table *t = nullptr;
        kvfence_status s = kvfence_table_new(&config, &t);
        if (s != KVFENCE_OK)
            return Result<Table>::failure(s);
        auto *shared = new (std::nothrow) detail::Shared{{t}, {1}};
        if (!shared) {
            kvfence_table_free(t);
            return Result<Table>::failure(KVFENCE_OUT_OF_MEMORY, "out of memory (kvfence.hpp)");
        }
        return Table(t, shared);
    }

    Table(Table &&o) noexcept : t_(o.t_), s_(o.s_) {
        o.t_ = nullptr;
        o.s_ = nullptr;
    }
    Table &operator=(Table &&o) noexcept {
        if (this != &o) {
            close();
            t_ = o.t_;
            s_ = o.s_;
            o.t_ = nullptr;
            o.s_ = nullptr;
        }
        return *this;
    }
    Table(const Table &) = delete;
    Table &operator=(const Table &) = delete;
    // Frees the table. Releases destroyed unread after this are freed (nowhere to give
    // them back); not concurrently with it.
    ~Table() { close(); }

    // The C handle, for calls this wrapper does not cover.
    kvfence_table *raw() const noexcept { return t_; }

    // Pool mode: a room of `npages` pool pages, their ids appended to `pages_out`.
    Result<Handle> open(const uint32_t *writers, size_t nwriters, size_t npages,
                        std::vector<uint32_t> &pages_out) {
        size_t at = pages_out.size();
        pages_out.resize(at + npages);
        Handle h{};
        kvfence_status s =
            kvfence_open(t_, writers, nwriters, npages, pages_out.data() + at, npages, &h);
        if (s != KVFENCE_OK) {
            pages_out.resize(at);
            return Result<Handle>::failure(s);
        }
        return h;
    }

    // Gate mode: a room for the engine's request `token` on its pages.
    Result<Handle> open_gate(const uint32_t *writers, size_t nwriters, uint64_t token,
                             const uint32_t *pages, size_t npages) {
        Handle h{};
        kvfence_status s = kvfence_open_gate(t_, writers, nwriters, token, pages, npages, &h);
        if (s != KVFENCE_OK)
            return Result<Handle>::failure(s);
        return h;
    }

    Result<void> grow(Handle h, size_t npages, std::vector<uint32_t> &pages_out) {
        size_t at = pages_out.size();
        pages_out.resize(at + npages);
        kvfence_status s = kvfence_grow(t_, h, npages, pages_out.data() + at, npages);
        if (s != KVFENCE_OK) {
            pages_out.resize(at);
            return Result<void>::failure(s);
        }
        return {};
    }

    Result<void> grow_gate(Handle h, const uint32_t *pages, size_t npages) {
        return status(kvfence_grow_gate(t_, h, pages, npages));
    }

    Result<std::vector<uint32_t>> pages_of(Handle h) {
        std::vector<uint32_t> out(16);
        for (;;) {
            size_t len = 0;
            kvfence_status s = kvfence_pages_of(t_, h, out.data(), out.size(), &len);
            if (s == KVFENCE_BAD_LENGTH && len > out.size()) {
                out.resize(len); // grown meanwhile or too small: retry
                continue;
            }
            if (s != KVFENCE_OK)
                return Result<std::vector<uint32_t>>::failure(s);
            out.resize(len);
            return out;
        }
    }

#ifdef KVFENCE_HPP_SPAN
    Result<Handle> open(std::span<const uint32_t> writers, size_t npages,
                        std::vector<uint32_t> &pages_out) {
        return open(writers.data(), writers.size(), npages, pages_out);
    }
    Result<Handle> open_gate(std::span<const uint32_t> writers, uint64_t token,
                             std::span<const uint32_t> pages) {
        return open_gate(writers.data(), writers.size(), token, pages.data(), pages.size());
    }
    Result<void> grow_gate(Handle h, std::span<const uint32_t> pages) {
        return grow_gate(h, pages.data(), pages.size());
    }
#endif

    // Starts a transfer (peer: the rank whose transport carries it, or KVFENCE_NO_PEER).
    inline Result<TransferGuard> begin(Handle h, uint32_t peer = KVFENCE_NO_PEER);

    Result<Quiesced> quiesce(Handle h, uint32_t rank) {
        kvfence_quiesced q{};
        kvfence_release r{};
        kvfence_status s = kvfence_quiesce(t_, h, rank, &q, &r);
        if (s != KVFENCE_OK)
            return Result<Quiesced>::failure(s);
        return Quiesced{q, take(r)};
    }

    Result<Aborted> abort(Handle h) {
        Aborted a{};
        kvfence_release r{};
        kvfence_status s = kvfence_abort(t_, h, a.fanout_buf.data(), a.fanout_buf.size(),
                                         &a.fanout_len, &r);
        if (s != KVFENCE_OK)
            return Result<Aborted>::failure(s);
        a.release = take(r);
        return a;
    }

    Result<Release> finish(Handle h) { return released(kvfence_finish, h); }
    /// A successful transfer's end: finish and quiesce every writer in one call; the
    /// release comes back here even from a release-queue table (kvfence_finish_drained).
    Result<Release> finish_drained(Handle h) { return released(kvfence_finish_drained, h); }
    Result<Release> quarantine(Handle h) { return released(kvfence_quarantine, h); }

    Result<Fenced> fence_rank(uint32_t rank) {
        Fenced f{};
        std::array<kvfence_release, 32> buf{};
        // Room first: a bad_alloc is thrown before the fence, never with releases in hand.
        f.released.reserve(buf.size());
        kvfence_status s = kvfence_fence_rank(t_, rank, &f.summary, buf.data(), buf.size());
        if (s != KVFENCE_OK)
            return Result<Fenced>::failure(s);
        for (size_t i = 0; i < f.summary.released; i++)
            f.released.push_back(take(buf[i])); // no allocation: reserved
        return f; // releases beyond 32 went to the queue (summary.queued counts them)
    }

    // true if the rank was fenced.
    Result<bool> readmit_rank(uint32_t rank) {
        bool was = false;
        kvfence_status s = kvfence_readmit_rank(t_, rank, &was);
        if (s != KVFENCE_OK)
            return Result<bool>::failure(s);
        return was;
    }

    // One queued release (empty() if none).
    Result<Release> pop_released() {
        kvfence_release r{};
        kvfence_status s = kvfence_pop_released(t_, &r);
        if (s != KVFENCE_OK)
            return Result<Release>::failure(s);
        return take(r);
    }

    // Appends every queued release to `out`; returns how many. If growing `out` throws
    // (std::bad_alloc), it throws before a batch is drained: every release is in `out` or
    // still queued, none lost.
    size_t drain_released(std::vector<Release> &out) {
        std::array<kvfence_release, 32> buf{};
        size_t total = 0, n = 0;
        do {
            out.reserve(out.size() + buf.size()); // may throw: nothing drained yet
            if (kvfence_drain_released(t_, buf.data(), buf.size(), &n) != KVFENCE_OK)
                break;
            for (size_t i = 0; i < n; i++)
                out.push_back(take(buf[i])); // no allocation: reserved
            total += n;
        } while (n == buf.size());
        return total;
    }

    size_t queued_releases() const {
        size_t n = 0;
        (void)kvfence_queued_releases(t_, &n);
        return n;
    }

    // true once released; false if the timeout ran out first.
    Result<bool> wait_released(Handle h, std::chrono::milliseconds timeout) {
        return waited(kvfence_wait_released(t_, h, to_ms(timeout)));
    }
    Result<bool> wait_released(Handle h) {
        return waited(kvfence_wait_released(t_, h, KVFENCE_WAIT_FOREVER));
    }
    Result<bool> wait_idle(std::chrono::milliseconds timeout) {
        return waited(kvfence_wait_idle(t_, to_ms(timeout)));
    }

    Result<kvfence_phase> phase(Handle h) const {
        kvfence_phase p{};
        kvfence_status s = kvfence_get_phase(t_, h, &p);
        if (s != KVFENCE_OK)
            return Result<kvfence_phase>::failure(s);
        return p;
    }

    Result<kvfence_room_status> room_status(Handle h) const {
        kvfence_room_status st{};
        kvfence_status s = kvfence_get_room_status(t_, h, &st);
        if (s != KVFENCE_OK)
            return Result<kvfence_room_status>::failure(s);
        return st;
    }

    // Counts and occupancy (the closing rooms and fenced ranks: kvfence_get_stats).
    Result<kvfence_stats> stats() const {
        kvfence_stats st{};
        st.struct_size = sizeof st;
        kvfence_status s = kvfence_get_stats(t_, &st, nullptr, 0, nullptr, 0);
        if (s != KVFENCE_OK)
            return Result<kvfence_stats>::failure(s);
        return st;
    }

  private:
    Table(kvfence_table *t, detail::Shared *s) noexcept : t_(t), s_(s) {}
    void close() noexcept {
        if (s_) {
            s_->table.store(nullptr, std::memory_order_release);
            detail::release_ref(s_);
            s_ = nullptr;
        }
        kvfence_table_free(t_);
        t_ = nullptr;
    }
    Release take(const kvfence_release &r) const noexcept { return Release(r, s_); }
    static Result<void> status(kvfence_status s) {
        if (s != KVFENCE_OK)
            return Result<void>::failure(s);
        return {};
    }
    static Result<bool> waited(kvfence_status s) {
        if (s == KVFENCE_OK)
            return true;
        if (s == KVFENCE_TIMED_OUT)
            return false;
        return Result<bool>::failure(s);
    }
    static uint64_t to_ms(std::chrono::milliseconds d) {
        return d.count() < 0 ? 0 : static_cast<uint64_t>(d.count());
    }
    template <class F> Result<Release> released(F f, Handle h) {
        kvfence_release r{};
        kvfence_status s = f(t_, h, &r);
        if (s != KVFENCE_OK)
            return Result<Release>::failure(s);
        return take(r);
    }

    kvfence_table *t_;
    detail::Shared *s_;
};

// A transfer in flight (move-only). End it with complete() (every byte landed) or fail()
// (the transfer engine reported an error: bytes may still land). Destroyed without either
// (an early return, an exception) it ends the transfer as FAILED, and a release that this
// performs (peer fenced or room quarantined already) goes to the release queue
// (Table::drain_released). The Table must outlive the guard.
class TransferGuard {
  public:
    TransferGuard(TransferGuard &&o) noexcept
        : t_(o.t_), s_(o.s_), token_(o.token_), live_(o.live_) {
        o.live_ = false;
    }
    TransferGuard &operator=(TransferGuard &&o) noexcept {
        if (this != &o) {
            drop();
            t_ = o.t_;
            s_ = o.s_;
            token_ = o.token_;
            live_ = o.live_;
            o.live_ = false;
        }
        return *this;
    }
    TransferGuard(const TransferGuard &) = delete;
    TransferGuard &operator=(const TransferGuard &) = delete;
    ~TransferGuard() { drop(); }

    // Ends the transfer as completed; the release if it was the closing room's last hold.
    Result<Release> complete() { return end(KVFENCE_COMPLETED); }
    // Ends the transfer as failed (the room stays held until its peer is fenced).
    Result<Release> fail() { return end(KVFENCE_FAILED); }
    // Whether the transfer is still in flight (not ended, not moved from).
    bool active() const noexcept { return live_; }
    kvfence_token token() const noexcept { return token_; }

  private:
    friend class Table;
    TransferGuard(kvfence_table *t, detail::Shared *s, kvfence_token token) noexcept
        : t_(t), s_(s), token_(token), live_(true) {}
    Result<Release> end(kvfence_outcome outcome) {
        if (!live_)
            return Result<Release>::failure(KVFENCE_INVALID_TOKEN, "the transfer was already ended");
        live_ = false;
        kvfence_release r{};
        kvfence_status s = kvfence_end(t_, token_, outcome, &r);
        if (s != KVFENCE_OK)
            return Result<Release>::failure(s);
        return Release(r, s_);
    }
    void drop() noexcept {
        if (live_) {
            live_ = false;
            (void)kvfence_end_queued(t_, token_, KVFENCE_FAILED);
        }
    }
    kvfence_table *t_;
    detail::Shared *s_; // the Table's (it outlives the guard): for the Releases of end()
    kvfence_token token_;
    bool live_;
};

inline Result<TransferGuard> Table::begin(Handle h, uint32_t peer) {
    kvfence_token tok{};
    kvfence_status s = kvfence_begin(t_, h, peer, &tok);
    if (s != KVFENCE_OK)
        return Result<TransferGuard>::failure(s);
    return TransferGuard(t_, s_, tok);
}

} // namespace kvfence

#endif // KVFENCE_HPP
