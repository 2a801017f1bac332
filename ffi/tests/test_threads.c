/* The race kvfence exists to close, from C with pthreads (gate mode, release queue):
 *
 *  - a decode thread opens requests on pages of a shared arena (its own free list), hands
 *    each request's write intent to every writer rank, aborts about half of them at once,
 *    finishes the rest, drains releases and only then reuses their pages;
 *  - WRITERS writer threads (one per prefill rank) take each intent and, under a transfer
 *    token (kvfence_begin .. kvfence_end), stamp their word of every page of the request
 *    with the request's id, with plain (non-atomic) stores; a refused begin writes nothing.
 *    Then they send the rank's ACK;
 *  - ACKERS ACK threads deliver the ACKs (kvfence_quiesce), some of them twice.
 *
 * Asserted: zero writes into a page after its reuse (a page handed to request B holds only
 * 0 or B when B is released, and a writer's token never covers a page owned by another
 * request), and every release delivered exactly once (per request id).
 *
 * Built with -DMUTATION_IGNORE_REFUSAL (writers write even when begin is refused: the
 * stale intent that kvfence refuses) or -DMUTATION_REUSE_ON_ABORT (decode reuses pages as
 * soon as it aborts, without waiting for the release) it must FAIL: ffi/ci.sh checks both.
 * -DMUTATION_LOSE_RELEASE (the decode thread drops one release) must fail the exactly-once
 * check, and -DMUTATION_LEAK_RELEASE (a release's page array never freed) must fail under
 * AddressSanitizer's leak check and valgrind. */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include "check.h"

#ifndef REQUESTS
#define REQUESTS 3000
#endif
#define WRITERS 4
#define ACKERS 2
#define PAGES 96
#define PER_REQ 4
#define WORDS WRITERS /* one word per writer rank: writers never race each other */
#define ROOMS 32
#define LAG 16 /* a request is finished (or aborted late) LAG requests after its open */

/* ---- a small blocking FIFO (mutex + condvars) ---- */
typedef struct {
    kvfence_handle handle;
    uint64_t req;
    uint32_t pages[PER_REQ];
    uint32_t rank;
    int kind; /* INTENT, ABORT (a notice that overtakes queued intents), STOP */
} msg;

enum { INTENT, ABORT, STOP };

typedef struct {
    msg buf[1024];
    size_t head, tail; /* head starts high so that push_front never wraps below 0 */
    pthread_mutex_t mu;
    pthread_cond_t nonempty, nonfull;
} fifo;

static void fifo_init(fifo *q) {
    memset(q, 0, sizeof *q);
    q->head = q->tail = (size_t)1 << 40;
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->nonempty, NULL);
    pthread_cond_init(&q->nonfull, NULL);
}

static void fifo_destroy(fifo *q) {
    pthread_mutex_destroy(&q->mu);
    pthread_cond_destroy(&q->nonempty);
    pthread_cond_destroy(&q->nonfull);
}

static void fifo_push(fifo *q, msg m) {
    pthread_mutex_lock(&q->mu);
    while (q->tail - q->head == 1024)
        pthread_cond_wait(&q->nonfull, &q->mu);
    q->buf[q->tail++ % 1024] = m;
    pthread_cond_signal(&q->nonempty);
    pthread_mutex_unlock(&q->mu);
}

/* An ABORT notice jumps the queue: it overtakes intents still queued (the stale intents
 * kvfence must refuse when they are finally taken). */
static void fifo_push_front(fifo *q, msg m) {
    pthread_mutex_lock(&q->mu);
    while (q->tail - q->head == 1024)
        pthread_cond_wait(&q->nonfull, &q->mu);
    q->buf[--q->head % 1024] = m;
    pthread_cond_signal(&q->nonempty);
    pthread_mutex_unlock(&q->mu);
}

static msg fifo_pop(fifo *q) {
    pthread_mutex_lock(&q->mu);
    while (q->tail == q->head)
        pthread_cond_wait(&q->nonempty, &q->mu);
    msg m = q->buf[q->head++ % 1024];
    pthread_cond_signal(&q->nonfull);
    pthread_mutex_unlock(&q->mu);
    return m;
}

/* ---- shared state ---- */
static kvfence_table *table;
static uint64_t arena[PAGES][WORDS];          /* plain memory: the KV pages */
static _Atomic uint64_t owner[PAGES];         /* request id owning the page (0: free) */
static fifo intents[WRITERS], acks;
static _Atomic long foreign_writes;           /* a token covered a page of another request */
static _Atomic long refused, written, duplicate_acks, stale_acks, bad_status;
static int released_count[REQUESTS + 1];      /* decode thread only */

static void *writer(void *arg) {
    uint32_t rank = (uint32_t)(uintptr_t)arg;
    unsigned seed = rank * 7919u + 1;
    static unsigned char acked[WRITERS][REQUESTS + 1], done[WRITERS][REQUESTS + 1];
    for (;;) {
        msg m = fifo_pop(&intents[rank]);
        if (m.kind == STOP)
            break;
        if (m.kind == ABORT) {
            /* Nothing of this request is in flight here (intents run one at a time): ACK
             * at once, even if its intent is still queued. */
            if (!done[rank][m.req]) {
                acked[rank][m.req] = 1;
                msg ack = m;
                ack.rank = rank;
                fifo_push(&acks, ack);
            }
            continue;
        }
        kvfence_token tok;
        kvfence_status s = kvfence_begin(table, m.handle, rank, &tok);
        int may_write = s == KVFENCE_OK;
        if (s != KVFENCE_OK && s != KVFENCE_ROOM_CLOSED && s != KVFENCE_STALE_HANDLE)
            atomic_fetch_add(&bad_status, 1);
        if (!may_write)
            atomic_fetch_add(&refused, 1);
#ifdef MUTATION_IGNORE_REFUSAL
        may_write = 1;
#endif
        if (may_write) {
            /* The transfer is in flight: let the decode thread's abort overtake it. */
            if (rand_r(&seed) % 4 == 0)
                sched_yield();
            for (int i = 0; i < PER_REQ; i++) {
                uint32_t p = m.pages[i];
                if (s == KVFENCE_OK && atomic_load(&owner[p]) != m.req)
                    atomic_fetch_add(&foreign_writes, 1);
                arena[p][rank] = m.req;
            }
            atomic_fetch_add(&written, 1);
        }
        if (s == KVFENCE_OK) {
            kvfence_release r;
            if (kvfence_end(table, tok, KVFENCE_COMPLETED, &r) != KVFENCE_OK ||
                r.reason != KVFENCE_REASON_NONE) /* queue mode: never returned directly */
                atomic_fetch_add(&bad_status, 1);
        }
        done[rank][m.req] = 1;
        if (!acked[rank][m.req]) { /* drained (the transfer ended): ACK */
            msg ack = m;
            ack.rank = rank;
            fifo_push(&acks, ack);
        }
    }
    return NULL;
}

static void *acker(void *arg) {
    unsigned seed = (unsigned)(uintptr_t)arg * 104729u + 3;
    for (;;) {
        msg m = fifo_pop(&acks);
        if (m.kind == STOP)
            break;
        int times = rand_r(&seed) % 8 == 0 ? 2 : 1; /* some ACKs arrive twice */
        for (int i = 0; i < times; i++) {
            kvfence_quiesced q;
            kvfence_release r;
            kvfence_status s = kvfence_quiesce(table, m.handle, m.rank, &q, &r);
            if (s == KVFENCE_STALE_HANDLE)
                atomic_fetch_add(&stale_acks, 1);
            else if (s != KVFENCE_OK || q == KVFENCE_QUIESCE_RELEASED)
                atomic_fetch_add(&bad_status, 1);
            else if (q == KVFENCE_QUIESCE_DUPLICATE)
                atomic_fetch_add(&duplicate_acks, 1);
        }
    }
    return NULL;
}

/* ---- the decode side (main thread) ---- */
static uint32_t free_pages[PAGES];
static size_t nfree;
static long violations; /* stale words found in a page at its release */

static void take_release(kvfence_release *r) {
    uint64_t req = r->token;
    if (req == 0 || req > REQUESTS || r->pages_len != PER_REQ) {
        bad_status++;
        kvfence_release_free(r);
        return;
    }
    released_count[req]++;
    for (size_t i = 0; i < r->pages_len; i++) {
        uint32_t p = r->pages[i];
        for (int w = 0; w < WORDS; w++)
            if (arena[p][w] != 0 && arena[p][w] != req)
                violations++; /* a write of another request landed after this one began */
#ifdef MUTATION_REUSE_ON_ABORT
        if (r->reason == KVFENCE_REASON_ABORTED)
            continue; /* already back in the free list since the abort */
#endif
        atomic_store(&owner[p], 0);
        free_pages[nfree++] = p;
    }
#ifndef MUTATION_LEAK_RELEASE
    kvfence_release_free(r);
#endif
}

static void drain(void) {
    kvfence_release out[16];
    size_t n;
    do {
        if (kvfence_drain_released(table, out, 16, &n) != KVFENCE_OK)
            bad_status++;
        for (size_t i = 0; i < n; i++) {
#ifdef MUTATION_LOSE_RELEASE
            if (out[i].token == REQUESTS / 2) {
                kvfence_release_free(&out[i]);
                continue;
            }
#endif
            take_release(&out[i]);
        }
    } while (n == 16);
}

static uint32_t req_pages[REQUESTS + 1][PER_REQ];

/* Aborts request `req`'s room (unless closed already) and sends ABORT notices to the ranks
 * of its fan-out. */
static void close_by_abort(kvfence_handle h, uint64_t req) {
    uint32_t fan[KVFENCE_MAX_WRITERS];
    size_t nf = 0;
    kvfence_release r;
    kvfence_status s = kvfence_abort(table, h, fan, KVFENCE_MAX_WRITERS, &nf, &r);
    if (s != KVFENCE_OK || r.reason != KVFENCE_REASON_NONE) {
        bad_status++;
        return;
    }
    msg notice = {.handle = h, .req = req, .kind = ABORT};
    for (size_t i = 0; i < nf; i++)
        fifo_push_front(&intents[fan[i]], notice);
#ifdef MUTATION_REUSE_ON_ABORT
    for (int i = 0; i < PER_REQ; i++) /* the bug kvfence prevents: free at abort */
        free_pages[nfree++] = req_pages[req][i];
#endif
}

static int allocate(uint32_t *pages) {
    if (nfree < PER_REQ)
        return 0;
    for (int i = 0; i < PER_REQ; i++)
        pages[i] = free_pages[--nfree];
    return 1;
}

int main(void) {
    kvfence_config c = kvfence_config_gate(ROOMS);
    c.release_queue = 1;
    OK(kvfence_table_new(&c, &table));
    for (int i = 0; i < WRITERS; i++)
        fifo_init(&intents[i]);
    fifo_init(&acks);
    for (uint32_t p = 0; p < PAGES; p++)
        free_pages[nfree++] = p;
    pthread_t wt[WRITERS], at[ACKERS];
    for (uintptr_t i = 0; i < WRITERS; i++)
        pthread_create(&wt[i], NULL, writer, (void *)i);
    for (uintptr_t i = 0; i < ACKERS; i++)
        pthread_create(&at[i], NULL, acker, (void *)i);

    uint32_t ranks[WRITERS];
    for (uint32_t i = 0; i < WRITERS; i++)
        ranks[i] = i;
    unsigned seed = 12345;
    long aborted = 0;
    msg lagging[LAG]; /* requests still to be closed, LAG requests after their open */
    for (uint64_t req = 1; req <= REQUESTS + LAG; req++) {
        kvfence_release r;
        /* Close the request opened LAG requests ago (unless aborted at once): finish it
         * (its writers have written and ACKed by now, or will), or abort it late. */
        if (req > LAG && lagging[req % LAG].kind == INTENT) {
            msg old = lagging[req % LAG];
            if (rand_r(&seed) % 4 == 0) {
                close_by_abort(old.handle, old.req);
                aborted++;
            } else if (kvfence_finish(table, old.handle, &r) != KVFENCE_OK ||
                       r.reason != KVFENCE_REASON_NONE) {
                bad_status++;
            }
        }
        if (req > REQUESTS)
            continue;
        msg m = {.req = req, .kind = INTENT};
        while (!allocate(m.pages)) { /* wait for releases to return pages */
            drain();
            sched_yield();
        }
        memcpy(req_pages[req], m.pages, sizeof m.pages);
        kvfence_status s;
        while ((s = kvfence_open_gate(table, ranks, WRITERS, req, m.pages, PER_REQ,
                                      &m.handle)) == KVFENCE_ROOM_TABLE_FULL) {
            drain();
            sched_yield();
        }
        if (s != KVFENCE_OK) {
            bad_status++;
            break;
        }
        for (int i = 0; i < PER_REQ; i++) {
            memset(arena[m.pages[i]], 0, sizeof arena[0]); /* fresh page for this request */
            atomic_store(&owner[m.pages[i]], req);
        }
        for (int w = 0; w < WRITERS; w++)
            fifo_push(&intents[w], m);
        lagging[req % LAG] = m;
        if (rand_r(&seed) % 2 == 0) {
            close_by_abort(m.handle, req); /* the client left at once: races the writes */
            aborted++;
            lagging[req % LAG].kind = ABORT; /* closed: nothing to do later */
        }
        drain();
    }
    /* Shutdown: wait until every room drained, collect the last releases. */
    for (int i = 0; i < 10000; i++) {
        drain();
        if (kvfence_wait_idle(table, 1) == KVFENCE_OK) {
            size_t q = 1;
            kvfence_queued_releases(table, &q);
            if (q == 0)
                break;
        }
    }
#ifndef MUTATION_LOSE_RELEASE
    drain();
#endif
    msg stop = {.kind = STOP};
    for (int i = 0; i < WRITERS; i++)
        fifo_push(&intents[i], stop);
    for (int i = 0; i < WRITERS; i++)
        pthread_join(wt[i], NULL);
    for (int i = 0; i < ACKERS; i++)
        fifo_push(&acks, stop);
    for (int i = 0; i < ACKERS; i++)
        pthread_join(at[i], NULL);

    long once = 0;
    for (int req = 1; req <= REQUESTS; req++)
        once += released_count[req] == 1;
    printf("test_threads: %d requests (%ld aborted), %ld writes, %ld refused begins, "
           "%ld duplicate and %ld stale ACKs\n",
           REQUESTS, aborted, (long)written, (long)refused, (long)duplicate_acks,
           (long)stale_acks);
    CHECK(violations == 0);                        /* no write into a page after its reuse */
    CHECK(atomic_load(&foreign_writes) == 0);      /* no token over another request's page */
    CHECK(once == REQUESTS);                       /* every release exactly once */
    CHECK(atomic_load(&bad_status) == 0);          /* no unexpected status anywhere */
    CHECK(atomic_load(&refused) > 0);              /* the race was actually exercised */
    kvfence_stats st = {.struct_size = sizeof st};
    OK(kvfence_get_stats(table, &st, NULL, 0, NULL, 0));
    CHECK(st.releases == REQUESTS && st.rooms.free == ROOMS);
    if (violations || foreign_writes)
        fprintf(stderr, "test_threads: %ld stale words, %ld foreign writes\n", violations,
                (long)foreign_writes);
    kvfence_table_free(table);
    for (int i = 0; i < WRITERS; i++)
        fifo_destroy(&intents[i]);
    fifo_destroy(&acks);
    return check_report("test_threads");
}
