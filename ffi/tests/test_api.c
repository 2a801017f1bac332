/* Every function of kvfence.h and every status a C caller can provoke, each asserted
 * exactly (ffi/ci.sh checks that every function and status name of the header appears in
 * the tests). Statuses no C caller can reach are tested in Rust (ffi/src/tests.rs):
 * KVFENCE_UNKNOWN_ROOM (needs a handle with a valid check for an index outside the
 * table: the check is keyed by the table's secret), KVFENCE_TOO_MANY_TRANSFERS (2^30 - 1
 * holds on one room), KVFENCE_PANIC (the core has no panicking path; the Rust test injects
 * one) and KVFENCE_INTERNAL_ERROR (a core error newer than the ABI). */
#define _GNU_SOURCE
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"

/* The value types' layout is part of the ABI (16-byte handles and tokens on the wire). */
_Static_assert(sizeof(kvfence_handle) == 16, "kvfence_handle is 16 bytes");
_Static_assert(sizeof(kvfence_token) == 16, "kvfence_token is 16 bytes");
_Static_assert(sizeof(kvfence_status) == 4, "kvfence_status is a uint32_t");
_Static_assert(sizeof(kvfence_config) == 40, "kvfence_config version 1 is 40 bytes");
_Static_assert(offsetof(kvfence_config, struct_size) == 0, "struct_size comes first");
_Static_assert(offsetof(kvfence_stats, struct_size) == 0, "struct_size comes first");

static kvfence_table *make(kvfence_config c) {
    kvfence_table *t = NULL;
    OK(kvfence_table_new(&c, &t));
    CHECK(t != NULL);
    return t;
}

static void statuses_versions_errors(void) {
    CHECK(strcmp(kvfence_status_str(KVFENCE_OK), "ok") == 0);
    CHECK(strstr(kvfence_status_str(KVFENCE_STALE_HANDLE), "stale") != NULL);
    CHECK(strcmp(kvfence_status_str(999), "unknown kvfence status") == 0);
    for (uint32_t s = 0; s <= 22; s++)
        CHECK(strcmp(kvfence_status_str(s), "unknown kvfence status") != 0);
    for (uint32_t s = KVFENCE_TIMED_OUT; s <= KVFENCE_INTERNAL_ERROR; s++)
        CHECK(strcmp(kvfence_status_str(s), "unknown kvfence status") != 0);
    CHECK(strcmp(kvfence_version(), "0.1.0") == 0);
    CHECK(kvfence_abi_version() == KVFENCE_ABI_VERSION);

    /* The last error names the detail; truncation keeps the NUL and reports the length. */
    kvfence_config bad = kvfence_config_gate(0);
    kvfence_table *t = (kvfence_table *)0x1;
    uint64_t id0 = kvfence_last_error_id();
    EXPECT(kvfence_table_new(&bad, &t), KVFENCE_INVALID_CONFIG);
    CHECK(t == (kvfence_table *)0x1); /* untouched on error */
    /* Every failure gets a new id; a success leaves it. */
    uint64_t id1 = kvfence_last_error_id();
    CHECK(id1 != 0 && id1 != id0);
    CHECK(kvfence_abi_version() == KVFENCE_ABI_VERSION && kvfence_last_error_id() == id1);
    char msg[256];
    size_t len = 0;
    OK(kvfence_last_error(msg, sizeof msg, &len));
    CHECK(strstr(msg, "rooms must be in") != NULL);
    CHECK(len == strlen(msg));
    char small[8];
    size_t full = 0;
    OK(kvfence_last_error(small, sizeof small, &full));
    CHECK(strlen(small) == 7 && full == len);
    OK(kvfence_last_error(NULL, 0, &full)); /* length only */
    CHECK(full == len);
    EXPECT(kvfence_last_error(NULL, 5, NULL), KVFENCE_NULL_POINTER);
    _Alignas(8) char raw[16];
    EXPECT(kvfence_last_error(msg, sizeof msg, (size_t *)(raw + 1)), KVFENCE_MISALIGNED_POINTER);
}

static void handles(void) {
    kvfence_table *t = make(kvfence_config_gate(8));
    uint32_t w[] = {0, 1};
    kvfence_handle h;
    OK(kvfence_open_gate(t, w, 2, 5, NULL, 0, &h));
    uint8_t bytes[16];
    OK(kvfence_handle_to_bytes(h, bytes, 16));
    EXPECT(kvfence_handle_to_bytes(h, bytes, 15), KVFENCE_BAD_LENGTH);
    EXPECT(kvfence_handle_to_bytes(h, NULL, 16), KVFENCE_NULL_POINTER);
    kvfence_handle back;
    OK(kvfence_handle_from_bytes(bytes, 16, &back));
    CHECK(kvfence_handle_eq(h, back));
    CHECK(memcmp(&h, &back, sizeof h) == 0);
    EXPECT(kvfence_handle_from_bytes(bytes, 17, &back), KVFENCE_BAD_LENGTH);
    EXPECT(kvfence_handle_from_bytes(NULL, 16, &back), KVFENCE_NULL_POINTER);
    EXPECT(kvfence_handle_from_bytes(bytes, 16, NULL), KVFENCE_NULL_POINTER);
    _Alignas(16) char raw[64];
    EXPECT(kvfence_handle_from_bytes(bytes, 16, (kvfence_handle *)(raw + 4)),
           KVFENCE_MISALIGNED_POINTER);
    CHECK(kvfence_handle_index(h) < 8);
    CHECK(kvfence_handle_generation(h) == kvfence_handle_generation(back));
    /* Little-endian wire form: the low word first. */
    uint64_t lo;
    memcpy(&lo, bytes, 8);
    CHECK(lo == h.lo);
    CHECK(kvfence_handle_index(h) == (uint32_t)(h.lo >> 32));

    /* Corrupted, zero and foreign handles are refused, never another room. */
    kvfence_phase ph;
    kvfence_handle flipped = h;
    flipped.lo ^= 1ull << 40;
    EXPECT(kvfence_get_phase(t, flipped, &ph), KVFENCE_INVALID_HANDLE);
    kvfence_handle zero = {0, 0};
    EXPECT(kvfence_get_phase(t, zero, &ph), KVFENCE_INVALID_HANDLE);
    CHECK(!kvfence_handle_eq(h, zero));
    kvfence_table *other = make(kvfence_config_gate(8));
    EXPECT(kvfence_get_phase(other, h, &ph), KVFENCE_INVALID_HANDLE);
    kvfence_table_free(other);
    OK(kvfence_get_phase(t, h, &ph));
    CHECK(ph == KVFENCE_PHASE_OWNED);
    EXPECT(kvfence_get_phase(t, h, NULL), KVFENCE_NULL_POINTER);
    EXPECT(kvfence_get_phase(NULL, h, &ph), KVFENCE_NULL_POINTER);
    EXPECT(kvfence_get_phase((kvfence_table *)(raw + 1), h, &ph), KVFENCE_MISALIGNED_POINTER);
    kvfence_table_free(t);
    kvfence_table_free(NULL); /* a no-op */
}

static void configs(void) {
    kvfence_config g = kvfence_config_gate(16);
    CHECK(g.struct_size == sizeof(kvfence_config));
    CHECK(g.rooms == 16 && g.pages == 0 && g.release_queue == 0);
    CHECK(g.max_fenced == 256 && g.max_tokens == 64);
    kvfence_config p = kvfence_config_pool(4, 100);
    CHECK(p.rooms == 4 && p.pages == 100);
    kvfence_table *t = NULL;
    EXPECT(kvfence_table_new(NULL, &t), KVFENCE_NULL_POINTER);
    EXPECT(kvfence_table_new(&g, NULL), KVFENCE_NULL_POINTER);
    _Alignas(8) char raw[sizeof(kvfence_config) + 16];
    memcpy(raw + 4, &g, sizeof g);
    EXPECT(kvfence_table_new((kvfence_config *)(raw + 4), &t), KVFENCE_MISALIGNED_POINTER);

    /* Versioning: a smaller struct is refused, a larger one only with a zero tail. */
    kvfence_config c = g;
    c.struct_size = 8;
    EXPECT(kvfence_table_new(&c, &t), KVFENCE_BAD_LENGTH);
    struct {
        kvfence_config c;
        uint64_t newer;
    } big = {g, 0};
    big.c.struct_size = sizeof big;
    OK(kvfence_table_new(&big.c, &t));
    kvfence_config read_back;
    OK(kvfence_table_config(t, &read_back));
    CHECK(read_back.struct_size == sizeof(kvfence_config) && read_back.rooms == 16);
    EXPECT(kvfence_table_config(t, NULL), KVFENCE_NULL_POINTER);
    kvfence_table_free(t);
    big.newer = 1;
    EXPECT(kvfence_table_new(&big.c, &t), KVFENCE_BAD_ARGUMENT);
    c = g;
    c.release_queue = 2;
    EXPECT(kvfence_table_new(&c, &t), KVFENCE_BAD_ARGUMENT);
    c = g;
    c.max_fenced = 0;
    EXPECT(kvfence_table_new(&c, &t), KVFENCE_INVALID_CONFIG);
    c = kvfence_config_pool(4, (1ull << 31) + 1);
    EXPECT(kvfence_table_new(&c, &t), KVFENCE_INVALID_CONFIG);
}

/* KVFENCE_OUT_OF_MEMORY: a child process whose address space is limited to 512 MiB asks
 * for 2^24 rooms. The host process goes on (the child reports and exits). Not under the
 * sanitizers or valgrind (they reserve large address ranges of their own). */
static void out_of_memory(void) {
    if (getenv("KVFENCE_NO_RLIMIT")) {
        printf("test_api: out-of-memory check skipped under %s\n", getenv("KVFENCE_NO_RLIMIT"));
        return;
    }
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        struct rlimit lim = {512u << 20, 512u << 20};
        setrlimit(RLIMIT_AS, &lim);
        kvfence_config c = kvfence_config_gate(1u << 24);
        kvfence_table *t = NULL;
        kvfence_status s = kvfence_table_new(&c, &t);
        _exit(s == KVFENCE_OUT_OF_MEMORY ? 0 : 1);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0); /* KVFENCE_OUT_OF_MEMORY in the child */
}

static void pool_mode(void) {
    kvfence_table *t = make(kvfence_config_pool(2, 8));
    uint32_t w[] = {0, 1, 2};
    uint32_t pages[8];
    kvfence_handle h, h2;
    EXPECT(kvfence_open(t, w, 3, 9, pages, 9, &h), KVFENCE_TOO_MANY_PAGES);
    EXPECT(kvfence_open(t, w, 3, 4, pages, 3, &h), KVFENCE_BAD_LENGTH);
    EXPECT(kvfence_open(t, w, 3, 4, NULL, 4, &h), KVFENCE_NULL_POINTER);
    EXPECT(kvfence_open(t, NULL, 3, 4, pages, 4, &h), KVFENCE_NULL_POINTER);
    EXPECT(kvfence_open(t, w, 3, 4, pages, 4, NULL), KVFENCE_NULL_POINTER);
    EXPECT(kvfence_open(t, (uint32_t *)((char *)w + 1), 2, 4, pages, 4, &h),
           KVFENCE_MISALIGNED_POINTER);
    EXPECT(kvfence_open(t, w, SIZE_MAX / 2, 4, pages, 4, &h), KVFENCE_BAD_LENGTH);
    uint32_t dup[] = {3, 3};
    EXPECT(kvfence_open(t, dup, 2, 1, pages, 8, &h), KVFENCE_DUPLICATE_WRITER);
    uint32_t inv[] = {UINT32_MAX};
    EXPECT(kvfence_open(t, inv, 1, 1, pages, 8, &h), KVFENCE_INVALID_RANK);
    uint32_t many[KVFENCE_MAX_WRITERS + 1];
    for (uint32_t i = 0; i <= KVFENCE_MAX_WRITERS; i++)
        many[i] = i;
    EXPECT(kvfence_open(t, many, KVFENCE_MAX_WRITERS + 1, 1, pages, 8, &h),
           KVFENCE_TOO_MANY_WRITERS);
    OK(kvfence_open(t, many, KVFENCE_MAX_WRITERS, 0, NULL, 0, &h)); /* 64 writers: fine */
    kvfence_release r;
    size_t nf;
    uint32_t fan[KVFENCE_MAX_WRITERS];
    OK(kvfence_abort(t, h, fan, KVFENCE_MAX_WRITERS, &nf, &r));
    CHECK(nf == KVFENCE_MAX_WRITERS && fan[63] == 63 && r.reason == KVFENCE_REASON_NONE);
    OK(kvfence_quarantine(t, h, &r));
    CHECK(r.reason == KVFENCE_REASON_QUARANTINED && r.pages == NULL && r.pages_len == 0);
    OK(kvfence_release_free(&r));

    OK(kvfence_open(t, w, 3, 5, pages, 8, &h));
    for (int i = 0; i < 5; i++)
        CHECK(pages[i] < 8);
    EXPECT(kvfence_open(t, w, 3, 4, pages, 8, &h2), KVFENCE_POOL_EXHAUSTED);
    uint32_t more[3];
    OK(kvfence_grow(t, h, 2, more, 3));
    EXPECT(kvfence_grow(t, h, 2, more, 1), KVFENCE_BAD_LENGTH);
    EXPECT(kvfence_grow(t, h, 2, more, 3), KVFENCE_POOL_EXHAUSTED); /* 7 of 8 taken */
    uint32_t lots[9];
    EXPECT(kvfence_grow(t, h, 9, lots, 9), KVFENCE_TOO_MANY_PAGES); /* more than the pool */
    EXPECT(kvfence_grow_gate(t, h, more, 1), KVFENCE_WRONG_MODE);
    EXPECT(kvfence_open_gate(t, w, 1, 0, NULL, 0, &h2), KVFENCE_WRONG_MODE);
    uint32_t list[8];
    size_t n = 0;
    EXPECT(kvfence_pages_of(t, h, list, 2, &n), KVFENCE_BAD_LENGTH);
    CHECK(n == 7); /* the size to retry with */
    OK(kvfence_pages_of(t, h, list, 8, &n));
    CHECK(n == 7 && list[5] == more[0] && list[6] == more[1]);
    EXPECT(kvfence_pages_of(t, h, list, 8, NULL), KVFENCE_NULL_POINTER);

    kvfence_stats s;
    memset(&s, 0, sizeof s);
    s.struct_size = sizeof s;
    OK(kvfence_get_stats(t, &s, NULL, 0, NULL, 0));
    CHECK(s.struct_size == sizeof s);
    CHECK(s.pages.owned == 7 && s.pages.free == 1 && s.rooms.owned == 1 && s.rooms.free == 1);
    CHECK(s.quarantined_rooms == 1);
    s.struct_size = 16;
    EXPECT(kvfence_get_stats(t, &s, NULL, 0, NULL, 0), KVFENCE_BAD_LENGTH);
    s.struct_size = sizeof s;
    EXPECT(kvfence_get_stats(t, NULL, NULL, 0, NULL, 0), KVFENCE_NULL_POINTER);
    EXPECT(kvfence_get_stats(t, &s, NULL, 1, NULL, 0), KVFENCE_NULL_POINTER);

    /* Finish: waits on the writers; the last ACK releases and the pages go back. */
    OK(kvfence_finish(t, h, &r));
    CHECK(r.reason == KVFENCE_REASON_NONE);
    EXPECT(kvfence_finish(t, h, &r), KVFENCE_ALREADY_FINISHED);
    EXPECT(kvfence_grow(t, h, 1, more, 3), KVFENCE_ROOM_CLOSED);
    EXPECT(kvfence_pages_of(t, h, list, 8, &n), KVFENCE_ROOM_CLOSED);
    kvfence_quiesced q;
    memset(&r, 0xab, sizeof r); /* garbage: "no release" writes only the reason */
    OK(kvfence_quiesce(t, h, 0, &q, &r));
    CHECK(q == KVFENCE_QUIESCE_RECORDED && r.reason == KVFENCE_REASON_NONE);
    OK(kvfence_release_free(&r)); /* a NONE release is never freed, whatever its fields */
    OK(kvfence_quiesce(t, h, 0, &q, &r));
    CHECK(q == KVFENCE_QUIESCE_DUPLICATE);
    OK(kvfence_quiesce(t, h, 1, &q, &r));
    EXPECT(kvfence_quiesce(t, h, 9, &q, &r), KVFENCE_RANK_NOT_IN_ROOM);
    EXPECT(kvfence_quiesce(t, h, 2, NULL, &r), KVFENCE_NULL_POINTER);
    EXPECT(kvfence_quiesce(t, h, 2, &q, NULL), KVFENCE_NULL_POINTER);
    OK(kvfence_quiesce(t, h, 2, &q, &r));
    CHECK(q == KVFENCE_QUIESCE_RELEASED && r.reason == KVFENCE_REASON_FINISHED);
    CHECK(r.pages_len == 7 && r.token == 0 && kvfence_handle_eq(r.handle, h));
    OK(kvfence_release_free(&r));
    CHECK(r.pages == NULL && r.reason == KVFENCE_REASON_NONE);
    OK(kvfence_release_free(&r)); /* a second free is harmless */
    EXPECT(kvfence_release_free(NULL), KVFENCE_NULL_POINTER);
    EXPECT(kvfence_quiesce(t, h, 2, &q, &r), KVFENCE_STALE_HANDLE); /* a late ACK */
    OK(kvfence_get_stats(t, &s, NULL, 0, NULL, 0));
    CHECK(s.pages.free == 8 && s.stale_refused == 1 && s.duplicate_acks == 1);
    CHECK(s.releases == 2);

    /* Room table full. */
    OK(kvfence_open(t, NULL, 0, 1, pages, 8, &h));
    OK(kvfence_open(t, NULL, 0, 1, pages, 8, &h2));
    kvfence_handle h3;
    EXPECT(kvfence_open(t, NULL, 0, 1, pages, 8, &h3), KVFENCE_ROOM_TABLE_FULL);
    OK(kvfence_wait_idle(t, 1) == KVFENCE_TIMED_OUT ? KVFENCE_OK : KVFENCE_BAD_ARGUMENT);
    OK(kvfence_finish(t, h, &r));
    CHECK(r.reason == KVFENCE_REASON_FINISHED && r.pages_len == 1);
    OK(kvfence_release_free(&r));
    OK(kvfence_abort(t, h2, NULL, 0, &nf, &r));
    CHECK(r.reason == KVFENCE_REASON_ABORTED && nf == 0);
    EXPECT(kvfence_abort(t, h2, NULL, 0, &nf, &r), KVFENCE_STALE_HANDLE);
    OK(kvfence_release_free(&r));
    OK(kvfence_wait_idle(t, KVFENCE_WAIT_FOREVER));
    OK(kvfence_wait_idle(t, 0));
    EXPECT(kvfence_wait_idle(NULL, 0), KVFENCE_NULL_POINTER);
    kvfence_table_free(t);
}

static void gate_mode_transfers(void) {
    kvfence_table *t = make(kvfence_config_gate(4));
    uint32_t w[] = {4, 9};
    uint32_t pg[] = {100, 101, 102};
    kvfence_handle h;
    EXPECT(kvfence_open(t, w, 2, 1, pg, 3, &h), KVFENCE_WRONG_MODE);
    EXPECT(kvfence_open_gate(t, w, 2, 42, NULL, 3, &h), KVFENCE_NULL_POINTER);
    /* A huge length is refused before the array is read (it would be far out of bounds). */
    EXPECT(kvfence_open_gate(t, w, 2, 42, pg, (1ull << 31) + 1, &h),
           KVFENCE_TOO_MANY_PAGES_IN_ROOM);
    OK(kvfence_open_gate(t, w, 2, 42, pg, 3, &h));
    uint32_t extra[] = {103};
    OK(kvfence_grow_gate(t, h, extra, 1));
    EXPECT(kvfence_grow_gate(t, h, extra, (1ull << 31) + 1), KVFENCE_TOO_MANY_PAGES_IN_ROOM);
    EXPECT(kvfence_grow_gate(t, h, NULL, 1), KVFENCE_NULL_POINTER);
    EXPECT(kvfence_grow(t, h, 1, extra, 1), KVFENCE_WRONG_MODE);
    uint32_t list[8];
    size_t n;
    OK(kvfence_pages_of(t, h, list, 8, &n));
    CHECK(n == 4 && list[0] == 100 && list[3] == 103);

    kvfence_token a, b, c;
    OK(kvfence_begin(t, h, 4, &a));
    OK(kvfence_begin(t, h, KVFENCE_NO_PEER, &b));
    OK(kvfence_begin(t, h, 9, &c));
    EXPECT(kvfence_begin(t, h, 4, NULL), KVFENCE_NULL_POINTER);
    kvfence_room_status rs;
    OK(kvfence_get_room_status(t, h, &rs));
    CHECK(rs.phase == KVFENCE_PHASE_OWNED && rs.transfers == 3 && rs.pages == 4);
    CHECK(rs.waiting_on_len == 2 && rs.waiting_on[0] == 4 && rs.waiting_on[1] == 9);
    CHECK(rs.quarantined == 0 && rs.closing_for_ms == 0);
    EXPECT(kvfence_get_room_status(t, h, NULL), KVFENCE_NULL_POINTER);

    kvfence_release r;
    EXPECT(kvfence_end(t, a, 7, &r), KVFENCE_BAD_ARGUMENT);
    EXPECT(kvfence_end(t, a, KVFENCE_COMPLETED, NULL), KVFENCE_NULL_POINTER);
    OK(kvfence_end(t, a, KVFENCE_COMPLETED, &r));
    CHECK(r.reason == KVFENCE_REASON_NONE);
    EXPECT(kvfence_end(t, a, KVFENCE_COMPLETED, &r), KVFENCE_INVALID_TOKEN); /* twice */
    kvfence_token forged = a;
    forged.hi ^= 1;
    EXPECT(kvfence_end(t, forged, KVFENCE_COMPLETED, &r), KVFENCE_INVALID_TOKEN);
    EXPECT(kvfence_end_queued(t, a, 5), KVFENCE_BAD_ARGUMENT);
    EXPECT(kvfence_end_queued(NULL, a, KVFENCE_COMPLETED), KVFENCE_NULL_POINTER);

    /* Abort: the fan-out; no transfer may begin; the room waits for ACKs and transfers. */
    uint32_t fan[KVFENCE_MAX_WRITERS];
    size_t nf = 99;
    EXPECT(kvfence_abort(t, h, fan, 2, &nf, &r), KVFENCE_BAD_LENGTH);
    CHECK(nf == 99); /* nothing written, nothing changed */
    EXPECT(kvfence_abort(t, h, fan, KVFENCE_MAX_WRITERS, NULL, &r), KVFENCE_NULL_POINTER);
    EXPECT(kvfence_abort(t, h, fan, KVFENCE_MAX_WRITERS, &nf, NULL), KVFENCE_NULL_POINTER);
    kvfence_phase ph;
    OK(kvfence_get_phase(t, h, &ph));
    CHECK(ph == KVFENCE_PHASE_OWNED); /* the refusals above changed nothing */
    OK(kvfence_abort(t, h, fan, KVFENCE_MAX_WRITERS, &nf, &r));
    CHECK(nf == 2 && fan[0] == 4 && fan[1] == 9 && r.reason == KVFENCE_REASON_NONE);
    EXPECT(kvfence_abort(t, h, fan, KVFENCE_MAX_WRITERS, &nf, &r), KVFENCE_ALREADY_ABORTED);
    EXPECT(kvfence_finish(t, h, &r), KVFENCE_ALREADY_ABORTED);
    kvfence_token d;
    EXPECT(kvfence_begin(t, h, 4, &d), KVFENCE_ROOM_CLOSED);
    EXPECT(kvfence_grow_gate(t, h, extra, 1), KVFENCE_ROOM_CLOSED);
    OK(kvfence_get_phase(t, h, &ph));
    CHECK(ph == KVFENCE_PHASE_ABORTING);
    EXPECT(kvfence_wait_released(t, h, 1), KVFENCE_TIMED_OUT);

    kvfence_quiesced q;
    OK(kvfence_quiesce(t, h, 4, &q, &r));
    OK(kvfence_quiesce(t, h, 9, &q, &r));
    CHECK(q == KVFENCE_QUIESCE_RECORDED); /* transfers b and c still hold it */
    /* b failed: with no peer, only quarantine ends it. c failed: fencing 9 ends it. */
    OK(kvfence_end(t, b, KVFENCE_FAILED, &r));
    CHECK(r.reason == KVFENCE_REASON_NONE);
    OK(kvfence_end(t, c, KVFENCE_FAILED, &r));
    CHECK(r.reason == KVFENCE_REASON_NONE);
    OK(kvfence_get_room_status(t, h, &rs));
    CHECK(rs.phase == KVFENCE_PHASE_ABORTING && rs.transfers == 2 && rs.failed == 2);
    CHECK(rs.waiting_on_len == 0);
    kvfence_fenced f;
    kvfence_release rel[2];
    OK(kvfence_fence_rank(t, 9, &f, rel, 2));
    CHECK(f.failed_ended == 1 && f.released == 0 && f.queued == 0);
    OK(kvfence_get_room_status(t, h, &rs));
    CHECK(rs.transfers == 1 && rs.failed == 1);
    EXPECT(kvfence_fence_rank(t, UINT32_MAX, &f, rel, 2), KVFENCE_INVALID_RANK);
    EXPECT(kvfence_fence_rank(t, 1, NULL, rel, 2), KVFENCE_NULL_POINTER);
    EXPECT(kvfence_fence_rank(t, 1, &f, NULL, 2), KVFENCE_NULL_POINTER);

    kvfence_stats s = {.struct_size = sizeof s};
    kvfence_room_status closing[4];
    uint32_t fenced[4];
    OK(kvfence_get_stats(t, &s, closing, 4, fenced, 4));
    CHECK(s.closing_len == 1 && s.fenced_len == 1 && fenced[0] == 9);
    CHECK(kvfence_handle_eq(closing[0].handle, h) && closing[0].failed == 1);
    CHECK(s.failed_transfers == 2 && s.pages.held == 4 && s.pages.free == 0);

    /* Quarantine: the release says never to reuse pages 100..103. */
    OK(kvfence_quarantine(t, h, &r));
    CHECK(r.reason == KVFENCE_REASON_QUARANTINED && r.token == 42 && r.pages_len == 4);
    CHECK(r.pages[0] == 100 && r.pages[3] == 103);
    OK(kvfence_release_free(&r));
    EXPECT(kvfence_quarantine(t, h, &r), KVFENCE_STALE_HANDLE);
    EXPECT(kvfence_quarantine(t, h, NULL), KVFENCE_NULL_POINTER);
    OK(kvfence_wait_released(t, h, KVFENCE_WAIT_FOREVER)); /* already: returns at once */
    OK(kvfence_wait_released(t, h, 0));
    kvfence_handle zero = {0, 0};
    EXPECT(kvfence_wait_released(t, zero, 0), KVFENCE_INVALID_HANDLE);
    OK(kvfence_get_phase(t, h, &ph));
    CHECK(ph == KVFENCE_PHASE_FREE);
    EXPECT(kvfence_get_room_status(t, h, &rs), KVFENCE_STALE_HANDLE);

    /* Fenced ranks cannot be named until re-admitted. */
    EXPECT(kvfence_open_gate(t, w, 2, 1, pg, 3, &h), KVFENCE_RANK_FENCED);
    bool was = false;
    OK(kvfence_readmit_rank(t, 9, &was));
    CHECK(was);
    OK(kvfence_readmit_rank(t, 9, &was));
    CHECK(!was);
    OK(kvfence_readmit_rank(t, 9, NULL));
    EXPECT(kvfence_readmit_rank(t, UINT32_MAX, &was), KVFENCE_INVALID_RANK);
    OK(kvfence_open_gate(t, w, 2, 1, pg, 3, &h));

    /* Token capacity (max_tokens 16 for 4 rooms): the 17th concurrent begin is refused. */
    kvfence_token toks[17];
    for (int i = 0; i < 16; i++)
        OK(kvfence_begin(t, h, 4, &toks[i]));
    EXPECT(kvfence_begin(t, h, 4, &toks[16]), KVFENCE_TOO_MANY_TOKENS);
    for (int i = 0; i < 16; i++)
        OK(kvfence_end(t, toks[i], KVFENCE_COMPLETED, &r));
    kvfence_table_free(t);

    kvfence_config one = kvfence_config_gate(2);
    one.max_fenced = 1;
    t = make(one);
    OK(kvfence_fence_rank(t, 1, &f, NULL, 0));
    EXPECT(kvfence_fence_rank(t, 2, &f, NULL, 0), KVFENCE_TOO_MANY_FENCED);
    kvfence_table_free(t);
}

/* The release queue, the overflow of a fence whose caller buffer is too small, and
 * kvfence_end_queued: every release is delivered exactly once. */
static void queue_and_overflow(void) {
    kvfence_config c = kvfence_config_gate(8);
    c.release_queue = 1;
    kvfence_table *t = make(c);
    uint32_t w[] = {1};
    kvfence_handle h[3];
    kvfence_release r;
    size_t nf;
    for (uint64_t i = 0; i < 3; i++) {
        uint32_t page = 10 + (uint32_t)i;
        OK(kvfence_open_gate(t, w, 1, i, &page, 1, &h[i]));
        OK(kvfence_abort(t, h[i], NULL, 0, &nf, &r));
    }
    kvfence_quiesced q;
    OK(kvfence_quiesce(t, h[0], 1, &q, &r));
    CHECK(q == KVFENCE_QUIESCE_QUEUED && r.reason == KVFENCE_REASON_NONE);
    size_t queued = 0;
    OK(kvfence_queued_releases(t, &queued));
    CHECK(queued == 1);
    EXPECT(kvfence_queued_releases(t, NULL), KVFENCE_NULL_POINTER);
    OK(kvfence_pop_released(t, &r));
    CHECK(r.reason == KVFENCE_REASON_ABORTED && r.token == 0 && r.pages[0] == 10);
    OK(kvfence_release_free(&r));
    OK(kvfence_pop_released(t, &r));
    CHECK(r.reason == KVFENCE_REASON_NONE);
    EXPECT(kvfence_pop_released(t, NULL), KVFENCE_NULL_POINTER);
    kvfence_fenced f;
    OK(kvfence_fence_rank(t, 1, &f, NULL, 0));
    CHECK(f.quiesced == 2 && f.queued == 2 && f.released == 0);
    kvfence_release out[4];
    size_t n = 0;
    OK(kvfence_drain_released(t, out, 1, &n)); /* one at a time: the rest stay queued */
    CHECK(n == 1);
    OK(kvfence_queued_releases(t, &queued));
    CHECK(queued == 1);
    OK(kvfence_drain_released(t, out + 1, 3, &n));
    CHECK(n == 1);
    CHECK(out[0].token + out[1].token == 1 + 2);
    OK(kvfence_releases_free(out, 2));
    EXPECT(kvfence_releases_free(NULL, 2), KVFENCE_NULL_POINTER);
    EXPECT(kvfence_drain_released(t, out, 4, NULL), KVFENCE_NULL_POINTER);
    EXPECT(kvfence_drain_released(t, NULL, 4, &n), KVFENCE_NULL_POINTER);
    OK(kvfence_readmit_rank(t, 1, NULL));
    kvfence_table_free(t);

    /* Direct delivery, a fence releasing 3 rooms into a 1-slot buffer: 2 overflow. */
    t = make(kvfence_config_gate(8));
    for (uint64_t i = 0; i < 3; i++) {
        OK(kvfence_open_gate(t, w, 1, 100 + i, NULL, 0, &h[i]));
        OK(kvfence_abort(t, h[i], NULL, 0, &nf, &r));
    }
    kvfence_release one;
    OK(kvfence_fence_rank(t, 1, &f, &one, 1));
    CHECK(f.released == 1 && f.queued == 2 && one.reason == KVFENCE_REASON_ABORTED);
    kvfence_stats s = {.struct_size = sizeof s};
    OK(kvfence_get_stats(t, &s, NULL, 0, NULL, 0));
    /* Queued by the core itself (before waiters woke), not by this library after. */
    CHECK(s.overflow_releases == 0 && s.releases == 1 && s.rooms.queued == 2);
    OK(kvfence_queued_releases(t, &queued));
    CHECK(queued == 2);
    OK(kvfence_drain_released(t, out, 4, &n));
    CHECK(n == 2);
    CHECK(one.token + out[0].token + out[1].token == 100 + 101 + 102);
    OK(kvfence_release_free(&one));
    OK(kvfence_releases_free(out, n));
    OK(kvfence_readmit_rank(t, 1, NULL));

    /* kvfence_end_queued: the release goes to the queue, not lost. */
    OK(kvfence_open_gate(t, NULL, 0, 7, w, 1, &h[0]));
    kvfence_token tok;
    OK(kvfence_begin(t, h[0], KVFENCE_NO_PEER, &tok));
    OK(kvfence_finish(t, h[0], &r));
    CHECK(r.reason == KVFENCE_REASON_NONE);
    OK(kvfence_end_queued(t, tok, KVFENCE_COMPLETED));
    EXPECT(kvfence_end_queued(t, tok, KVFENCE_COMPLETED), KVFENCE_INVALID_TOKEN);
    OK(kvfence_pop_released(t, &r));
    CHECK(r.reason == KVFENCE_REASON_FINISHED && r.token == 7 && r.pages_len == 1);
    OK(kvfence_release_free(&r));
    OK(kvfence_queued_releases(t, &queued));
    CHECK(queued == 0);

    /* kvfence_release_requeue: a release given back unread is delivered by the next drain
     * (the C++ Release's destructor uses it), with its pages; the struct is emptied. */
    OK(kvfence_open_gate(t, NULL, 0, 8, w, 1, &h[0]));
    OK(kvfence_finish(t, h[0], &r));
    CHECK(r.reason == KVFENCE_REASON_FINISHED && r.token == 8);
    OK(kvfence_release_requeue(t, &r));
    CHECK(r.reason == KVFENCE_REASON_NONE && r.pages == NULL);
    OK(kvfence_release_requeue(t, &r)); /* NONE: nothing to give back */
    OK(kvfence_queued_releases(t, &queued));
    CHECK(queued == 1);
    OK(kvfence_get_stats(t, &s, NULL, 0, NULL, 0));
    CHECK(s.overflow_releases == 1);
    OK(kvfence_drain_released(t, out, 4, &n));
    CHECK(n == 1 && out[0].reason == KVFENCE_REASON_FINISHED && out[0].token == 8 &&
          out[0].pages_len == 1 && out[0].pages[0] == 1);
    OK(kvfence_releases_free(out, n));
    EXPECT(kvfence_release_requeue(t, NULL), KVFENCE_NULL_POINTER);
    EXPECT(kvfence_release_requeue(NULL, &r), KVFENCE_NULL_POINTER);
    kvfence_release junk;
    memset(&junk, 0, sizeof junk);
    junk.reason = (kvfence_reason)9;
    EXPECT(kvfence_release_requeue(t, &junk), KVFENCE_BAD_ARGUMENT);
    kvfence_table_free(t);
}

/* kvfence_finish_drained: a successful transfer's end in one call; the release comes
 * back to the caller even from a release-queue table, and an aborted room is refused with
 * nothing quiesced. */
static void finish_drained(void) {
    kvfence_config cfg = kvfence_config_gate(4);
    cfg.release_queue = 1;
    kvfence_table *t = make(cfg);
    uint32_t w[] = {3, 5};
    uint32_t pg[] = {7, 8};
    kvfence_handle h, g;
    kvfence_release r;
    size_t queued;
    OK(kvfence_open_gate(t, w, 2, 42, pg, 2, &h));
    OK(kvfence_finish_drained(t, h, &r));
    CHECK(r.reason == KVFENCE_REASON_FINISHED && r.token == 42 && r.pages_len == 2);
    CHECK(kvfence_handle_eq(r.handle, h) && r.pages[0] == 7 && r.pages[1] == 8);
    OK(kvfence_release_free(&r));
    OK(kvfence_queued_releases(t, &queued));
    CHECK(queued == 0); /* returned, not queued */
    EXPECT(kvfence_finish_drained(t, h, &r), KVFENCE_STALE_HANDLE);
    EXPECT(kvfence_finish_drained(t, h, NULL), KVFENCE_NULL_POINTER);
    EXPECT(kvfence_finish_drained(NULL, h, &r), KVFENCE_NULL_POINTER);

    OK(kvfence_open_gate(t, w, 2, 43, pg, 2, &g));
    uint32_t fanout[KVFENCE_MAX_WRITERS];
    size_t nf;
    OK(kvfence_abort(t, g, fanout, KVFENCE_MAX_WRITERS, &nf, &r));
    CHECK(nf == 2 && r.reason == KVFENCE_REASON_NONE);
    EXPECT(kvfence_finish_drained(t, g, &r), KVFENCE_ALREADY_ABORTED);
    kvfence_quiesced q;
    OK(kvfence_quiesce(t, g, 3, &q, &r));
    CHECK(q == KVFENCE_QUIESCE_RECORDED); /* rank 3 still pending: nothing was quiesced */
    OK(kvfence_quiesce(t, g, 5, &q, &r));
    CHECK(q == KVFENCE_QUIESCE_QUEUED);
    OK(kvfence_queued_releases(t, &queued));
    CHECK(queued == 1);
    kvfence_table_free(t);
}

int main(void) {
    statuses_versions_errors();
    handles();
    configs();
    out_of_memory();
    pool_mode();
    gate_mode_transfers();
    queue_and_overflow();
    finish_drained();
    return check_report("test_api");
}
