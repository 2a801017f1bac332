/* Issue 40 item 6: the misuses kvfence.h now warns about, done on purpose, so that ci.sh
 * can show what catches them (each mode is a bug: the program must be reported).
 *
 *   test_misuse double-free   copies a kvfence_release and frees both copies (the header:
 *                             "free exactly one copy")
 *   test_misuse use-after-free ends a transfer on a table already freed (a C++
 *                             TransferGuard outliving its Table): the access is inside the
 *                             uninstrumented library, so AddressSanitizer does not see it;
 *                             valgrind memcheck does (the header says so)
 *   test_misuse               (no argument) the correct use: one free, the table freed
 *                             last; must pass everywhere
 */
#include <string.h>

#include "check.h"

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "";
    kvfence_config c = kvfence_config_gate(4);
    kvfence_table *t = NULL;
    OK(kvfence_table_new(&c, &t));
    uint32_t pages[] = {1, 2, 3};
    kvfence_handle h;
    kvfence_token tok;
    kvfence_release r;
    OK(kvfence_open_gate(t, NULL, 0, 9, pages, 3, &h));
    OK(kvfence_begin(t, h, KVFENCE_NO_PEER, &tok));
    OK(kvfence_finish(t, h, &r));
    CHECK(r.reason == KVFENCE_REASON_NONE);
    if (strcmp(mode, "use-after-free") == 0) {
        kvfence_table_free(t);
        /* The guard's destructor, after the Table's. */
        (void)kvfence_end_queued(t, tok, KVFENCE_FAILED);
        return check_report("test_misuse use-after-free (undetected)");
    }
    OK(kvfence_end(t, tok, KVFENCE_COMPLETED, &r));
    CHECK(r.reason == KVFENCE_REASON_FINISHED && r.pages_len == 3);
    kvfence_release copy = r; /* a plain C copy: the same page array */
    OK(kvfence_release_free(&r));
    if (strcmp(mode, "double-free") == 0)
        (void)kvfence_release_free(&copy); /* the second free of one array */
    kvfence_table_free(t);
    return check_report("test_misuse");
}
