/* Issue 40 item 1: "wait, then drain" finds every release that went to the release queue.
 *
 * The header promises that once kvfence_wait_released (or kvfence_wait_idle) returns, the
 * next kvfence_drain_released delivers a release that went to the queue. Two calls queue a
 * release because their caller cannot take it: kvfence_end_queued (every C++
 * TransferGuard destructor) and kvfence_fence_rank beyond the caller's buffer. Before the
 * fix both let the core deliver the release (free the room index, wake the waiters) and
 * only then pushed it into a queue of the C layer's own: a waiter that drained in between
 * found nothing.
 *
 * Each round: the main thread opens a gate-mode room (direct delivery) and makes a worker
 * thread end its last hold in one of those two ways while the main thread waits on it
 * (kvfence_wait_released, or kvfence_wait_idle as a shutdown does) and then drains once:
 * the drain must deliver the release, every round. Both threads are released together by
 * a spin barrier so that the wait overlaps the worker's call.
 *
 * ROUNDS (default 20000) rounds; "test_wait_drain: N passed, M failed". */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include "check.h"

#ifndef ROUNDS
#define ROUNDS 20000
#endif

enum job { JOB_NONE, JOB_END_QUEUED, JOB_FENCE, JOB_QUIT };

static kvfence_table *table;
static _Atomic int job = JOB_NONE;  /* set by main, taken by the worker */
static _Atomic int go;              /* the spin barrier: round number both have reached */
static _Atomic int worker_at;
static kvfence_token token;
static _Atomic int worker_errors;

#define WRITER 7u

static void spin_until(_Atomic int *v, int want) {
    for (unsigned i = 0; atomic_load(v) != want; i++)
        if (i % 64 == 63)
            sched_yield();
}

static void *worker(void *arg) {
    (void)arg;
    for (int round = 1;; round++) {
        spin_until(&worker_at, round); /* main announces round `round` */
        int j = atomic_load(&job);
        if (j == JOB_QUIT)
            return NULL;
        atomic_store(&go, round); /* both go */
        if (j == JOB_END_QUEUED) {
            if (kvfence_end_queued(table, token, KVFENCE_COMPLETED) != KVFENCE_OK)
                atomic_fetch_add(&worker_errors, 1);
        } else {
            kvfence_fenced f;
            /* No caller buffer: the release must go to the queue. */
            if (kvfence_fence_rank(table, WRITER, &f, NULL, 0) != KVFENCE_OK || f.queued != 1)
                atomic_fetch_add(&worker_errors, 1);
            if (kvfence_readmit_rank(table, WRITER, NULL) != KVFENCE_OK)
                atomic_fetch_add(&worker_errors, 1);
        }
    }
}

int main(void) {
    kvfence_config c = kvfence_config_gate(4);
    if (kvfence_table_new(&c, &table) != KVFENCE_OK)
        return 2;
    pthread_t th;
    pthread_create(&th, NULL, worker, NULL);
    long missed[2][2] = {{0, 0}, {0, 0}}; /* [job - 1][wait_idle] */
    long rounds[2][2] = {{0, 0}, {0, 0}};
    int round = 0;
    for (int i = 0; i < ROUNDS; i++) {
        int j = i % 2 ? JOB_FENCE : JOB_END_QUEUED;
        int idle = (i / 2) % 2;
        uint32_t page = (uint32_t)i;
        uint32_t w = WRITER;
        kvfence_handle h;
        kvfence_release r;
        size_t nf;
        if (j == JOB_END_QUEUED) {
            /* A transfer holds the aborted room; the worker's end_queued releases it. */
            OK(kvfence_open_gate(table, NULL, 0, (uint64_t)i, &page, 1, &h));
            OK(kvfence_begin(table, h, KVFENCE_NO_PEER, &token));
        } else {
            /* The room waits on writer 7's ACK; the worker fences 7 with no buffer. */
            OK(kvfence_open_gate(table, &w, 1, (uint64_t)i, &page, 1, &h));
        }
        OK(kvfence_abort(table, h, NULL, 0, &nf, &r));
        CHECK(r.reason == KVFENCE_REASON_NONE);
        atomic_store(&job, j);
        atomic_store(&worker_at, ++round);
        spin_until(&go, round);
        if (idle)
            OK(kvfence_wait_idle(table, KVFENCE_WAIT_FOREVER));
        else
            OK(kvfence_wait_released(table, h, KVFENCE_WAIT_FOREVER));
        kvfence_release out[2];
        size_t n = 0;
        OK(kvfence_drain_released(table, out, 2, &n));
        rounds[j - 1][idle]++;
        if (n != 1 || out[0].token != (uint64_t)i || out[0].pages_len != 1 ||
            out[0].pages[0] != page) {
            missed[j - 1][idle]++;
            /* Not lost, only late: take it before the next round (the worker is done with
             * this round once its release is out). */
            while (n == 0) {
                sched_yield();
                OK(kvfence_drain_released(table, out, 2, &n));
            }
        }
        OK(kvfence_releases_free(out, n));
        /* Wait for the worker's readmit: a room naming writer 7 opens only once it is
         * admitted again. */
        if (j == JOB_FENCE) {
            kvfence_stats s = {.struct_size = sizeof s};
            do {
                OK(kvfence_get_stats(table, &s, NULL, 0, NULL, 0));
            } while (s.fenced_len != 0);
        }
    }
    atomic_store(&job, JOB_QUIT);
    atomic_store(&worker_at, ++round);
    pthread_join(th, NULL);
    CHECK(atomic_load(&worker_errors) == 0);
    const char *names[2] = {"kvfence_end_queued", "kvfence_fence_rank beyond its buffer"};
    for (int j = 0; j < 2; j++)
        for (int idle = 0; idle < 2; idle++) {
            printf("test_wait_drain: %s, %s then drain: %ld of %ld rounds found nothing\n",
                   names[j], idle ? "wait_idle" : "wait_released", missed[j][idle],
                   rounds[j][idle]);
            CHECK(missed[j][idle] == 0);
        }
    kvfence_table_free(table);
    return check_report("test_wait_drain");
}
