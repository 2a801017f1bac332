/* Issue 40 item 2: memory running out is KVFENCE_OUT_OF_MEMORY, never an abort of the host.
 *
 * A child process lowers its address-space limit (RLIMIT_AS, soft limit only, so it can
 * raise it again) to its current size plus 16 MiB and asks for more than that through each
 * call that copies a caller-sized page list: kvfence_open_gate (the copy of the engine's
 * list), kvfence_grow_gate, kvfence_pages_of (the copy of a 64 MiB room), kvfence_open and
 * kvfence_grow (pool mode: the room's list of claimed ids), kvfence_get_stats (a snapshot
 * of 65,536 closing rooms), and kvfence_last_error after each (it formats into the
 * caller's buffer). Before the fix the first of them died of
 * SIGABRT (Rust's allocation-failure handler); now each returns the status and the
 * table is still usable (the same call succeeds once the limit is raised).
 *
 * Not under ASan/TSan/valgrind (they reserve large address ranges of their own). */
#define _GNU_SOURCE
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"

#define BIG ((size_t)1 << 24) /* page ids: 64 MiB */

/* Current virtual size of this process, bytes. */
static size_t vm_size(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long pages = 0;
    if (!f || fscanf(f, "%lu", &pages) != 1)
        pages = 0;
    if (f)
        fclose(f);
    return (size_t)pages * (size_t)sysconf(_SC_PAGESIZE);
}

static void limit(size_t bytes) {
    struct rlimit lim;
    getrlimit(RLIMIT_AS, &lim);
    lim.rlim_cur = bytes;
    setrlimit(RLIMIT_AS, &lim);
}

static void unlimit(void) {
    struct rlimit lim;
    getrlimit(RLIMIT_AS, &lim);
    lim.rlim_cur = lim.rlim_max;
    setrlimit(RLIMIT_AS, &lim);
}

/* The checks, in the child: exits with the number of failed checks. */
static int child(void) {
    uint32_t *list = mmap(NULL, BIG * 4, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                          -1, 0);
    CHECK(list != MAP_FAILED);
    if (list == MAP_FAILED)
        return 1;
    kvfence_config gc = kvfence_config_gate(4);
    kvfence_table *gate = NULL;
    OK(kvfence_table_new(&gc, &gate));
    kvfence_config pc = kvfence_config_pool(4, BIG);
    kvfence_table *pool = NULL;
    OK(kvfence_table_new(&pc, &pool));
    kvfence_handle h, small, ph;
    uint32_t one = 1;
    OK(kvfence_open_gate(gate, NULL, 0, 1, &one, 1, &small));
    uint32_t *ids = malloc(BIG * 4);
    CHECK(ids != NULL);
    char msg[128];
    size_t len = 0;

    limit(vm_size() + (16u << 20));
    EXPECT(kvfence_open_gate(gate, NULL, 0, 2, list, BIG, &h), KVFENCE_OUT_OF_MEMORY);
    OK(kvfence_last_error(msg, sizeof msg, &len));
    CHECK(strstr(msg, "out of memory") != NULL);
    EXPECT(kvfence_grow_gate(gate, small, list, BIG), KVFENCE_OUT_OF_MEMORY);
    EXPECT(kvfence_open(pool, NULL, 0, BIG, ids, BIG, &ph), KVFENCE_OUT_OF_MEMORY);
    OK(kvfence_open(pool, NULL, 0, 1, ids, BIG, &ph));
    EXPECT(kvfence_grow(pool, ph, BIG - 1, ids, BIG), KVFENCE_OUT_OF_MEMORY);
    OK(kvfence_last_error(msg, sizeof msg, &len));
    CHECK(strstr(msg, "out of memory") != NULL);

    /* The same calls succeed once memory is there: nothing was left half-done. */
    unlimit();
    OK(kvfence_open_gate(gate, NULL, 0, 2, list, BIG, &h));
    limit(vm_size() + (16u << 20));
    size_t n = 0;
    EXPECT(kvfence_pages_of(gate, h, ids, BIG, &n), KVFENCE_OUT_OF_MEMORY);
    unlimit();
    OK(kvfence_pages_of(gate, h, ids, BIG, &n));
    CHECK(n == BIG);
    OK(kvfence_grow_gate(gate, small, list, 16));
    kvfence_release r;
    OK(kvfence_finish(gate, h, &r));
    CHECK(r.reason == KVFENCE_REASON_FINISHED && r.pages_len == BIG);
    OK(kvfence_release_free(&r));
    kvfence_table_free(gate);
    kvfence_table_free(pool);
    free(ids);

    /* kvfence_get_stats: its snapshot lists every closing room (~300 bytes each): 2^16
     * aborted rooms, still waiting on writer 3, need ~20 MiB. */
    kvfence_config sc = kvfence_config_gate(1u << 16);
    kvfence_table *st = NULL;
    OK(kvfence_table_new(&sc, &st));
    uint32_t three = 3;
    int opened = 1;
    for (uint32_t i = 0; i < (1u << 16) && opened; i++) {
        size_t nf;
        opened = kvfence_open_gate(st, &three, 1, i, NULL, 0, &h) == KVFENCE_OK &&
                 kvfence_abort(st, h, NULL, 0, &nf, &r) == KVFENCE_OK;
    }
    CHECK(opened);
    kvfence_stats stats = {.struct_size = sizeof stats};
    limit(vm_size() + (16u << 20));
    EXPECT(kvfence_get_stats(st, &stats, NULL, 0, NULL, 0), KVFENCE_OUT_OF_MEMORY);
    unlimit();
    OK(kvfence_get_stats(st, &stats, NULL, 0, NULL, 0));
    CHECK(stats.closing_len == (1u << 16) && stats.rooms.held == (1u << 16));
    kvfence_table_free(st);
    return check_report("test_oom (child)");
}

int main(void) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        int rc = child();
        fflush(stdout);
        _exit(rc);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    if (WIFSIGNALED(st))
        fprintf(stderr, "test_oom: the child died of signal %d (an allocation failure "
                        "aborted the process)\n", WTERMSIG(st));
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    return check_report("test_oom");
}
