/*
 * kvfence.pml -- a Promela model of kvfence's release protocol, checked with SPIN.
 *
 * Models src/room_word.rs (the room word), src/writers.rs (the mask word), src/table.rs
 * (open with its rollback, abort, finish, quiesce, close), src/fence.rs (fence_rank,
 * readmit_rank, the fence mutex), src/transfer.rs (begin, complete, fail, drop without
 * outcome, the failed-transfer registry) and src/release.rs (release_to, deliver, the
 * release queue and its drainers, quarantine), pool mode.
 * README.md (next to this file) maps every process, variable and step to the Rust code
 * and says what is abstracted away.
 *
 * Memory model: SPIN interleaves whole steps, so it checks sequentially consistent
 * executions only. Each atomic load, store, CAS, fetch_sub, fetch_or or fetch_and of the
 * Rust code is one step (a d_step / atomic block), except where README.md lists a merge;
 * fence(SeqCst) is a no-op. Weak memory is loom's job (loom-tests/).
 *
 * Sizes: 2 rooms, 2 writer ranks, 2-3 pages; at most NOPEN opens per run (generations
 * 0..NOPEN-1), NXFER (0 or 1) local transfers, NREPLAY late/duplicate ACKs, one
 * fence/readmit cycle of rank 0 (rank 1 is never fenced), NDRAIN release-queue drainers.
 *
 * Checked:
 *  (a) assert: a write of lifecycle L (a rank's, a live transfer's, a failed transfer's
 *      late write) lands only on a page that belongs to L; no page goes back to the pool
 *      while a live transfer, a failed transfer whose transport is still up, or a live
 *      rank incarnation holding a request naming it could write it;
 *  (b) assert: each lifecycle's release is decided at most once (one RMW), delivered
 *      (Released built: pages and index handed back) at most once and only if decided,
 *      at most one queue entry per room; at quiescence every decided release was
 *      delivered and the queue is empty;
 *  (c) assert: after every step that changes a bitmap or the page owners, each page is
 *      in the pool xor owned by one lifecycle (a quarantined page stays owned forever) and
 *      a non-FREE room is claimed; at quiescence free + owned + quarantined == capacity
 *      for pages, free + claimed == capacity for rooms;
 *  (d) ltl live (compile with -DLIVENESS, run pan -a -f): a closing room whose writers
 *      all ACKed or were fenced (or it was quarantined) and whose transfers completed (or
 *      failed and their peer was then fenced, or it was quarantined) is eventually
 *      released and delivered (word FREE and index back in the room bitmap).
 *  (e) assert: a quarantine decides with the close or changes nothing: a lifecycle whose
 *      release is reported Quarantined had no quarantine call refused (StaleHandle), and
 *      a refused quarantine's lifecycle is never released as Quarantined (checked both
 *      at the release and at the refusal, whichever comes second).
 *
 * Variants (-D...), each must break a property:
 *   NAIVE_RELEASE         abort releases at once ("free at abort")                  (a)
 *   READMIT_RACE          readmit_rank does not take the fence mutex                (a)
 *   OPEN_NO_PENDING_CHECK open without its check (b) "every writer still pending"   (a)
 *   OPEN_SELF_QUIESCE     the old open: quiesces a fenced writer itself, returns Ok (a)
 *   SEND_AFTER_RETURN     the caller reads the rank's transport after open returned,
 *                         not as it was at the return                               (a)
 *   FAILED_AS_DRAINED     fail drops the hold like complete                         (a)
 *   SEND_BEFORE_READMIT   the caller sends a request over rank 0's new transport
 *                         before readmit_rank(0) returned                           (a)
 *   XFER_BEFORE_READMIT   a transfer to rank 0 is posted over its new transport
 *                         before readmit_rank(0) returned                           (a)
 *   QUARANTINE_FREES      a quarantined release returns its pages                   (a)
 *   SKIP_ACK_GEN_CHECK    quiesce trusts the room word's generation                 (a)
 *   RACY_POP              the queue pops with load + store, not fetch_and           (b)
 *   STORE_RELEASE         the pre-issue-42 release: the last drop's fetch_sub decides
 *                         and a plain store of FREE follows (a refused begin's
 *                         transient unit is erased under it)                       (b)
 *   PUBLISH_STORE         publish stores the word instead of adding OWNED to it (a
 *                         stale begin's transient unit in a FREE word is erased)   (b)
 *   RELOAD_DROP           drop_hold decides from a fresh load, not the fetch_sub   (b)
 * And one variant that must pass since issue 42 (see verify/spin/README.md):
 *   CLOSE_IN_GAP          close accepts a closing room at 0 holds: with the release a
 *                         CAS from "closing, no hold", that close is one more CAS
 *                         competing for the same release, and exactly one wins
 *   NO_OPEN_RECHECK       open does not re-read the fenced ranks after publishing   (d)
 *   QUAR_MARK_FIRST       the pre-fix quarantine: a separate mark stored before its
 *                         close, read by the releaser after the deciding RMW        (e)
 */

#define NR 2            /* rooms */
#define NK 2            /* writer ranks */
#ifndef NP
#define NP 2            /* pages (2 or 3) */
#endif
#ifndef MAXN
#define MAXN 1          /* pages per open: 1..MAXN */
#endif
#define NG 4            /* generations per room a lifecycle id can name */

#ifndef NOPEN
#define NOPEN 2
#endif
#ifndef NXFER
#define NXFER 1
#endif
#ifndef NREPLAY
#define NREPLAY 1
#endif
#ifndef NDRAIN
#define NDRAIN 1
#endif
#ifndef MAXACT
#define MAXACT 2        /* close/quarantine calls per handle */
#endif

/* Phase (room_word.rs, Phase::bits) */
#define FREE     0
#define OWNED    1
#define ABORTING 2
#define DRAINING 3

/* Reason (release.rs) */
#define R_FIN 0
#define R_ABT 1
#define R_QUA 2

/* outcome of one modelled call */
#define OK      0
#define STALE   1   /* Refusal::Stale, MaskStale, Error::StaleHandle */
#define PHASE   2   /* Refusal::Phase */
#define NOTIN   3   /* rank not in the list */
#define DUP     4   /* Cleared::Duplicate */
#define BITCLR  5   /* Cleared::Bit */
#define LAST    6   /* Cleared::LastOfWord: the caller now owns the word's hold */
#define HELD    7   /* Step::Held */
#define REL     8   /* Step::Released: this call won the release */
#define REFUSED 9   /* open refused, begin refused */
#define DROPNOW 10  /* a failed transfer whose peer is fenced / room quarantined */
#define TRY     11  /* a fetch_sub took a closing room to no hold: try the release CAS */

/* transfer outcomes */
#define O_COMPLETE 0
#define O_FAIL     1
#define O_DROP     2   /* guard dropped without outcome: failed, a release is queued */

#ifdef QUEUE_ALL
#define QALL 1          /* Config::release_queue(true) */
#else
#define QALL 0
#endif

#define LC(i, g)   ((i) * NG + (g))     /* lifecycle id: room i, generation g */
/* What the deciding RMW observed, for the release's reason: the closing phase, or
   CLOSED_Q for a quarantined (Aborting + Q) word. */
#define CLOSED_Q   4
#define CPH(i)     (qbit[i] -> CLOSED_Q : ph[i])
#define B(x)       (1 << (x))
#define CLOSING(i) (ph[i] == ABORTING || ph[i] == DRAINING)

/* ------------------------------------------------------------ the table (src/) */
byte ph[NR];        /* room word: phase   (RoomWord, room_word.rs) */
byte holds[NR];     /* room word: holds */
byte wgen[NR];      /* room word: generation */
byte mgen[NR];      /* mask word: generation (Writers::masks[0], writers.rs) */
byte morig[NR];     /* the writer list of the lifecycle (Writers::ids/count) */
byte mpend[NR];     /* mask word: pending positions (position r = rank r) */
byte rfree = 3;     /* RoomTable::rooms_free (Bitmap; 1 = free) */
byte pfree = (1 << NP) - 1;  /* RoomTable::pages_free */
byte plist[NR];     /* Slot::pages, the UnsafeCell page list, as a page set */
byte fenced;        /* RoomTable::fenced (FencedRanks), bit r */
bit  fmutex;        /* RoomTable::fence_lock */
byte rbmark[NR];    /* Slot::rolled_back: gen + 1 of the rolled-back lifecycle, 0 none */
byte qbit[NR];      /* room word: the quarantine bit Q (RoomWord::quarantine sets it in the
                       CAS that closes the room; the word's release clears it) */
#ifdef QUAR_MARK_FIRST
byte qmark[NR];     /* MUTATION: the pre-fix Slot::quarantine_mark (gen + 1 of the marked
                       lifecycle, 0 none), stored before quarantine's close */
#endif
bit  flock;         /* RoomTable::failed (the Mutex of the failed-transfer registry) */
bit  freg;          /* ... the registry holds the (one) failed transfer */
byte fidx, fgen;    /* ... FailedTransfer { index, gen, */
bit  fpeer;         /*                          peer: 1 = Some(0), 0 = None } */
byte qbits;         /* RoomTable::queue (PendingSet): words[0] */
byte qcount;        /* PendingSet::count */
byte qgen[NR];      /* Slot::queued: tagged(gen, reason) */
byte qrsn[NR];

/* ------------------------------------------------------------ the environment */
byte inc[NK];       /* rank r's current transport incarnation */
bit  down[NK];      /* rank r's current transport is torn down */
byte act[NK];       /* lifecycles rank r was sent and has not ACKed */
byte ainc[NK];      /* ... the incarnation each was sent to (one bit: 0 or 1) */
byte acked[NK];     /* lifecycles rank r has ACKed (their ACK may be replayed) */
byte pubh[NR];      /* latest handle of room i known to the transfer thread (gen + 1) */
byte replays;       /* late/duplicate ACKs delivered so far */
bit  readm;         /* readmit_rank(0) has returned */
byte nprod;         /* producer processes still running (drainers stop after them) */

/* ------------------------------------------------------------ ghost state */
byte page_lc[NP];       /* lifecycle owning each page, + 1; 0 = in the pool */
byte lc_pages[2 * NG];  /* each lifecycle's pages (fixed once published) */
byte qpages;            /* pages quarantined (out of the pool for good) */
byte relset;            /* lifecycles whose release was decided */
byte quaset;            /* lifecycles whose release was reported Quarantined */
byte qref;              /* lifecycles whose quarantine call was refused (StaleHandle) */
byte delset;            /* lifecycles whose release was delivered */
byte xst;               /* the transfer: 0 none/completed, 1 live, 2 failed (bytes may land) */
byte xlc;               /* ... its lifecycle */
bit  xpeer;             /* ... its peer: 1 = rank 0 (its bytes go over rank 0's transport) */
byte xinc;              /* ... rank 0's incarnation it was posted over */
bit  xhold;             /* ... its hold is still in the room word */
#ifdef LIVENESS
byte wdone[NR];         /* writers of room i's lifecycle known done: ACK returned, a
                           fence_rank of the rank returned after open handed the room
                           out, quarantine returned, or open's rollback gave them up */
bit  xres;              /* the failed transfer is resolved: a fence_rank of its peer
                           began after fail() returned and has returned, or its room's
                           quarantine returned */
bit  xfd;               /* fail() (or the drop) has returned */
byte hnd[NR];           /* gen + 1 of the lifecycle open handed out (returned Ok) */
#endif

/* a live incarnation of rank r holds the request of lifecycle k */
#define ALIVE(r, k) (((act[r] >> (k)) & 1) && !down[r] && (((ainc[r] >> (k)) & 1) == inc[r]))
/* the failed transfer's bytes may still land */
#define XALIVE      (xst == 2 && (xpeer == 0 || (!down[0] && inc[0] == xinc)))

/* (c) per step */
#define PAGE_OK(p) ((((pfree >> (p)) & 1) == 1) != (page_lc[p] != 0))
#define ROOM_OK(i) (ph[i] == FREE || ((rfree >> (i)) & 1) == 0)
#if NP == 3
#define INVARIANT  (PAGE_OK(0) && PAGE_OK(1) && PAGE_OK(2) && ROOM_OK(0) && ROOM_OK(1))
#else
#define INVARIANT  (PAGE_OK(0) && PAGE_OK(1) && ROOM_OK(0) && ROOM_OK(1))
#endif

#ifdef LIVENESS
/* (d) */
#define XPENDS(i)  (xhold && xlc / NG == (i) && !(xst == 2 && xres))
#define DRAINED(i) (CLOSING(i) && (morig[i] & ~wdone[i]) == 0 && !XPENDS(i))
#define FREED(i)   (ph[i] == FREE && ((rfree >> (i)) & 1) == 1)
ltl live { ([] (DRAINED(0) -> <> FREED(0))) && ([] (DRAINED(1) -> <> FREED(1))) }
#endif

/* ------------------------------------------------------------ helpers */
inline pick_page(set, v) {
    if
    :: ((set) & 1) -> v = 0
    :: ((set) & 2) -> v = 1
    :: ((set) & 4) -> v = 2
    fi
}

inline pick8(set, v) {
    if
    :: ((set) & 1)   -> v = 0
    :: ((set) & 2)   -> v = 1
    :: ((set) & 4)   -> v = 2
    :: ((set) & 8)   -> v = 3
    :: ((set) & 16)  -> v = 4
    :: ((set) & 32)  -> v = 5
    :: ((set) & 64)  -> v = 6
    :: ((set) & 128) -> v = 7
    fi
}

/* (b) the RMW that decides a release: at most once per lifecycle */
inline decide_release(l) {
    printf("RELEASE of lifecycle %d (room %d gen %d) decided\n", l, (l) / NG, (l) % NG);
    assert((relset & B(l)) == 0);
    relset = relset | B(l)
}

/* RoomTable::deliver: the Released value is built (exactly once), the page list taken,
   pool pages freed (unless quarantined), the room index freed. One step.
   (a): no page goes back while anything of an earlier lifecycle could write it. */
inline deliver_tail(i, l, rsn) {
    printf("DELIVER lifecycle %d (reason %d; 2 = quarantined, pages kept): pages %d, room %d free\n", l, rsn, plist[i], i);
    assert((relset & B(l)) != 0);
    assert((delset & B(l)) == 0);
    delset = delset | B(l);
    assert(!(xhold && xlc == l));              /* no transfer hold of l is left */
    assert((pfree & plist[i]) == 0);
    assert(((rfree >> i) & 1) == 0);
    assert(ph[i] == FREE && wgen[i] == (l % NG) + 1);
    if
    :: rsn != R_QUA ->
       p = 0;
       do
       :: p < NP ->
          if
          :: (plist[i] >> p) & 1 ->
             assert(page_lc[p] == l + 1);
             k = 0;
             do
             :: k < 2 * NG ->
                assert(!(ALIVE(0, k) && ((lc_pages[k] >> p) & 1)));
                assert(!(ALIVE(1, k) && ((lc_pages[k] >> p) & 1)));
                k++
             :: else -> break
             od;
             assert(!(XALIVE && ((lc_pages[xlc] >> p) & 1)));
             page_lc[p] = 0
          :: else
          fi;
          p++
       :: else -> break
       od;
       pfree = pfree | plist[i]
    :: else -> qpages = qpages | plist[i]     /* never back (Reason::Quarantined) */
    fi;
    plist[i] = 0;
    rfree = rfree | B(i);
    p = 0; k = 0;
    assert(INVARIANT)
}

/* RoomTable::release_to after the deciding RMW (and, for drop_hold, its store): load of
   the rolled-back mark; the reason from what the deciding RMW observed (cph: the closing
   phase, or CLOSED_Q); then deliver (directly), or queue: store Slot::queued,
   PendingSet::push (count fetch_add, bit fetch_or). One step. */
inline release_to(i, g, cph, toq) {
    d_step {
        rl = LC(i, g);
        if
        :: rbmark[i] == g + 1 ->
           printf("release of rolled-back lifecycle %d: returned to service silently\n", rl);
           rsn = R_ABT; deliver_tail(i, rl, rsn)
        :: else ->
#ifdef QUARANTINE_FREES
           rsn = (cph == ABORTING || cph == CLOSED_Q -> R_ABT : R_FIN);   /* MUTATION */
#else
           /* the reason is the one the deciding RMW observed (phase and Q) */
           rsn = (cph == CLOSED_Q -> R_QUA : (cph == ABORTING -> R_ABT : R_FIN));
#ifdef QUAR_MARK_FIRST
           /* MUTATION: the pre-fix release_to, which read a separate mark after the RMW */
           if :: qmark[i] == g + 1 -> rsn = R_QUA :: else fi;
#endif
#endif
           /* ghost for (e): a release reported Quarantined; its quarantine was not refused */
           if
           :: rsn == R_QUA ->
              assert((qref & B(rl)) == 0);
              quaset = quaset | B(rl)
           :: else
           fi;
           if
           :: (toq || QALL) ->
              printf("release of lifecycle %d pushed to the release queue\n", rl);
              assert((qbits & B(i)) == 0);
              qgen[i] = g; qrsn[i] = rsn;
              qcount++; qbits = qbits | B(i)
           :: else -> deliver_tail(i, rl, rsn)
           fi
        fi;
        rl = 0; rsn = 0
    }
}

/* RoomWord::release_if_last's CAS (issue 42): after a fetch_sub took a closing room of
   generation og to no hold, the release is a CAS from exactly "closing, og, no hold" to
   FREE, og + 1; the reason is read from the value it replaces. It gives up (res = HELD)
   if a refused begin's transient unit came in (that unit's back_out tries again) or the
   release was done (by that back_out). One step (a strong CAS on the current value). */
inline try_release(i, og) {
    d_step {
        if
        :: (wgen[i] == og && CLOSING(i) && holds[i] == 0) ->
           cph = CPH(i); ph[i] = FREE; qbit[i] = 0; wgen[i] = og + 1; res = REL;
           decide_release(LC(i, og))
        :: else -> res = HELD
        fi
    }
}

/* RoomWord::drop_hold(g) for a hold the caller owns, then the release if it decided one.
   x: 0 a mask word's hold, 1 a completed transfer's, 2 a failed transfer's. */
inline drop_hold(i, g, x, toq) {
    rl = LC(i, g);
#if defined(NAIVE_RELEASE)
    /* under the mutation the Rust code uses drop_hold_checked: one CAS */
    d_step {
        if :: x == 1 -> xst = 0; xhold = 0 :: x == 2 -> xhold = 0 :: else fi;
        if
        :: (wgen[i] != g || ph[i] == FREE || holds[i] == 0) -> res = STALE
        :: else ->
           holds[i]--;
           if
           :: (holds[i] == 0 && CLOSING(i)) ->
              cph = CPH(i); ph[i] = FREE; qbit[i] = 0; wgen[i] = g + 1; res = REL; decide_release(rl)
           :: else -> res = HELD
           fi
        fi
    };
#elif defined(RELOAD_DROP)
    /* MUTATION: fetch_sub, then decide from a fresh load, not from its returned value */
    d_step {
        assert(wgen[i] == g && holds[i] > 0 && ph[i] != FREE);
        holds[i]--;
        if :: x == 1 -> xst = 0; xhold = 0 :: x == 2 -> xhold = 0 :: else fi
    };
    d_step {
        if
        :: (holds[i] == 0 && CLOSING(i)) -> cph = CPH(i); res = REL; decide_release(rl)
        :: else -> res = HELD
        fi
    };
    if
    :: res == REL -> d_step { ph[i] = FREE; qbit[i] = 0; holds[i] = 0; wgen[i] = g + 1 }
    :: else
    fi;
#elif defined(STORE_RELEASE)
    /* MUTATION: the pre-issue-42 release: the value the fetch_sub returns decides */
    d_step {
        assert(wgen[i] == g && holds[i] > 0 && ph[i] != FREE);   /* its debug_assert */
        holds[i]--;
        if :: x == 1 -> xst = 0; xhold = 0 :: x == 2 -> xhold = 0 :: else fi;
        if
        :: (holds[i] == 0 && CLOSING(i)) -> cph = CPH(i); res = REL; decide_release(rl)
        :: else -> res = HELD
        fi
    };
    if
    :: res == REL ->
       /* the plain store of FREE, gen + 1 (of `released()`: no holds) */
       d_step { ph[i] = FREE; qbit[i] = 0; holds[i] = 0; wgen[i] = g + 1 }
    :: else
    fi;
#else
    /* one fetch_sub; if it took a closing room to no hold, the release CAS */
    d_step {
        assert(wgen[i] == g && holds[i] > 0 && ph[i] != FREE);   /* its debug_assert */
        holds[i]--;
        if :: x == 1 -> xst = 0; xhold = 0 :: x == 2 -> xhold = 0 :: else fi;
        if
        :: (holds[i] == 0 && CLOSING(i)) -> res = TRY
        :: else -> res = HELD
        fi
    };
    if :: res == TRY -> try_release(i, g) :: else fi;
#endif
    if
    :: res == REL -> release_to(i, g, cph, toq)
    :: else
    fi;
    cph = 0
}

/* RoomTable::clear_position(i, qg, r): Writers::clear (one CAS); if that emptied the word,
   drop the word's hold (which may release) */
inline quiesce_in(i, qg, r, toq) {
    d_step {
        if
        :: mgen[i] != qg -> res = STALE
        :: else ->
           if
           :: (morig[i] & B(r)) == 0 -> res = NOTIN
           :: else ->
              if
              :: (mpend[i] & B(r)) == 0 -> res = DUP
              :: else ->
                 mpend[i] = mpend[i] & ~B(r);
                 printf("rank %d's pending bit cleared in room %d gen %d\n", r, i, qg);
                 if
                 :: mpend[i] == 0 -> res = LAST
                 :: else -> res = BITCLR
                 fi
              fi
           fi
        fi
    };
    if
    :: res == LAST -> drop_hold(i, qg, 0, toq)
    :: else
    fi
}

/* RoomTable::quiesce((i, ag), r): load the room word (stale unless same generation and
   not FREE), then clear_position. The load is merged with the caller's preceding step. */
#ifdef SKIP_ACK_GEN_CHECK
#define QUIESCE_LOAD  qg = wgen[i]; res = OK     /* MUTATION: trust the word's generation */
#else
#define QUIESCE_LOAD  if :: (wgen[i] != ag || ph[i] == FREE) -> res = STALE \
                         :: else -> qg = ag; res = OK fi
#endif

/* RoomWord::close(g, to) (one CAS), then the release if it decided one */
inline close(i, g, to, toq) {
    rl = LC(i, g);
    d_step {
        if
        :: (wgen[i] != g || ph[i] == FREE) -> res = STALE
#ifndef CLOSE_IN_GAP
        :: (wgen[i] == g && CLOSING(i) && holds[i] == 0) -> res = STALE   /* the release gap */
#endif
        :: else ->
           if
           :: !(ph[i] == OWNED || (ph[i] == DRAINING && to == ABORTING)) -> res = PHASE
           :: else ->
#ifdef NAIVE_RELEASE
              if
              :: to == ABORTING -> holds[i] = 0     /* MUTATION: free the pages at abort */
              :: else
              fi;
#endif
              if
              :: holds[i] == 0 ->
                 assert(qbit[i] == 0);   /* a quarantined room is Aborting: refused above */
                 ph[i] = FREE; wgen[i] = g + 1; res = REL; decide_release(rl)
              :: else -> ph[i] = to; res = HELD
              fi
           fi
        fi
    };
    if
    :: res == REL -> release_to(i, g, to, toq)
    :: else
    fi
}

/* ------------------------------------------------------------ processes */

#define LOCALS byte i, g, ag, qg, rl, res, p, k, r, cph, rsn

/* open() returns Ok: the caller sends the request to each writer over its transport as it
   is now (the fence contract), keeps the handle, hands it to the transfer thread. */
inline send_request(r0inc) {
    if
#ifndef SEND_BEFORE_READMIT
    :: ((w & 1) && inc[0] == 1 && !readm) ->
       printf("rank 0's new transport is not in service before readmit_rank returned: not sent\n")
#endif
    :: else -> if
    :: (w & 1) ->
       act[0] = act[0] | B(lc);
       if :: r0inc -> ainc[0] = ainc[0] | B(lc) :: else -> ainc[0] = ainc[0] & ~B(lc) fi;
       printf("request of lifecycle %d sent to rank 0, incarnation %d (torn down: %d)\n", lc, r0inc, down[0])
    :: else
    fi fi;
    if :: w & 2 -> act[1] = act[1] | B(lc) :: else fi
}
inline hand_out() {
    printf("open returns room %d gen %d\n", i, g);
    pubh[i] = g + 1;
    oh = oh | B(i); ohg[i] = g; ost[i] = 0; nact[i] = 0;
#ifdef LIVENESS
    hnd[i] = g + 1;
#endif
    skip
}

/* another call on a handle in state st (1 finished, 2 aborted, 3 quarantined) is modelled */
#ifdef NO_QUAR
#ifdef NO_ABORT_DRAINING
#define MORE(st) 0
#else
#define MORE(st) ((st) == 1)
#endif
#else
#ifdef NO_ABORT_DRAINING
#define MORE(st) ((st) != 3)
#else
#define MORE(st) ((st) != 3)
#endif
#endif

/* The decode scheduler thread: open (and its rollback), abort, finish, quarantine. */
proctype Opener() {
    LOCALS;
    byte opens, w, n, lc, post, taken, oh, act0, tk, tg;
    byte ohg[NR], ost[NR], nact[NR];
    do
    :: opens < NOPEN ->
       /* open(writers w, n pages): check_writers, fenced.first_of */
       atomic {
           opens++;
           if :: w = 1
#ifndef NO_EMPTY_WRITERS
              :: w = 0
#endif
#ifndef NO_RANK1
              :: w = 3
#endif
#ifdef ALL_WRITER_SETS
              :: w = 2
#endif
           fi;
           if :: n = 1 :: MAXN >= 2 -> n = 2 fi;
           if
           :: (w & fenced) != 0 -> res = REFUSED;
              printf("open(writers %d, %d pages): RankFenced\n", w, n)
           :: else -> res = OK
           fi
       };
       if :: res != OK -> goto open_out :: else fi;
       /* rooms_free.claim_one, pages_free.claim_many, word gen load, token/sized/closed_at/
          failed stores, Writers::stamp, RoomWord::publish: one step (see README) */
       atomic {
           if
           :: (rfree & 1) -> i = 0
           :: (rfree & 2) -> i = 1
           :: rfree == 0 -> res = REFUSED
           fi;
           if
           :: res == OK ->
                  lc = LC(i, wgen[i]);
                  /* holds: only transient units of refused begins (issue 42) */
                  assert(wgen[i] < NG && ph[i] == FREE && plist[i] == 0);
                  taken = 0; p = 0; k = 0;
                  do
                  :: (p < NP && k < n) ->
                     if :: (pfree >> p) & 1 -> taken = taken | B(p); k++ :: else fi;
                     p++
                  :: else -> break
                  od;
                  if
                  :: k == n ->
                     rfree = rfree & ~B(i);
                     pfree = pfree & ~taken; plist[i] = taken; p = 0;
                     do
                     :: p < NP ->
                        if :: (taken >> p) & 1 -> assert(page_lc[p] == 0); page_lc[p] = lc + 1 :: else fi;
                        p++
                     :: else -> break
                     od;
                     g = wgen[i]; mgen[i] = g; morig[i] = w; mpend[i] = w;
#ifdef PUBLISH_STORE
                     ph[i] = OWNED; holds[i] = (w != 0 -> 1 : 0);   /* MUTATION: a store */
#else
                     /* RoomWord::publish: a fetch_add of OWNED and the writer hold: a
                        transient unit of a stale begin in the FREE word stays */
                     ph[i] = OWNED; holds[i] = holds[i] + (w != 0 -> 1 : 0);
#endif
                     lc_pages[lc] = plist[i];
#ifdef LIVENESS
                     wdone[i] = 0;
#endif
                     printf("open: room %d gen %d (lifecycle %d) published, writers %d, pages %d\n", i, g, lc, w, plist[i]);
                     assert(INVARIANT)
                  :: else -> res = REFUSED;   /* PoolExhausted: the index is freed again */
                     printf("open: pool exhausted\n")
                  fi;
                  p = 0; k = 0; taken = 0
           :: else -> printf("open: room table full\n")
           fi
       };
       if :: res != OK -> goto open_out :: else fi;
#if defined(OPEN_SELF_QUIESCE)
       /* MUTATION (the old open): fence(SeqCst); re-read the fenced ranks; quiesce each
          fenced writer itself (a release went to the orphan list: here the queue); Ok */
       d_step { post = w & fenced };
       r = 0;
       do
       :: r < NK ->
          if
          :: (post >> r) & 1 ->
             printf("open: rank %d was fenced meanwhile: open quiesces it itself\n", r);
             quiesce_in(i, g, r, 1)
          :: else
          fi;
          r++
       :: else -> break
       od;
       r = 0;
       d_step { send_request(inc[0]); hand_out(); post = 0 };
#else
       /* fence(SeqCst); check (a): fenced.first_of(writers) */
       d_step {
#ifndef NO_OPEN_RECHECK
           post = w & fenced;
#endif
#ifdef OPEN_NO_PENDING_CHECK
           /* MUTATION: no check (b): open returns here */
           if
           :: post == 0 -> send_request(inc[0]); hand_out()
           :: else -> printf("open: a writer is fenced now: roll back, RankFenced\n")
           fi
#else
           if
           :: post != 0 -> printf("open: a writer is fenced now: roll back, RankFenced\n")
           :: else
           fi
#endif
       };
#ifndef OPEN_NO_PENDING_CHECK
       if
       :: post == 0 ->
          /* check (b): pending_positions(gen).count() == writers.len(); open returns */
          d_step {
              if
              :: ((mgen[i] == g -> mpend[i] : 0) != w) -> post = 1;
                 printf("open: a writer is no longer pending (a fence came and went): roll back, RankFenced\n")
              :: else ->
#ifdef SEND_AFTER_RETURN
                 skip
#else
                 send_request(inc[0]);
#endif
                 hand_out()
              fi
          };
#ifdef SEND_AFTER_RETURN
          /* MUTATION (integrator): reads the rank's transport after the return */
          if :: post == 0 -> d_step { send_request(inc[0]) } :: else fi;
#endif
          skip
       :: else
       fi;
#endif
       if
       :: post != 0 ->
          /* RoomTable::roll_back: mark, give up every pending writer, close (Aborting) */
          d_step {
              rbmark[i] = g + 1;
              post = (mgen[i] == g -> mpend[i] : 0);
#ifdef LIVENESS
              wdone[i] = morig[i];
#endif
              skip
          };
          r = 0;
          do
          :: r < NK ->
             if :: (post >> r) & 1 -> quiesce_in(i, g, r, 0) :: else fi;
             r++
          :: else -> break
          od;
          r = 0;
          close(i, g, ABORTING, 0)
       :: else
       fi;
       post = 0;
#endif
open_out: skip;
       w = 0; n = 0; i = 0; g = 0; lc = 0; res = 0; qg = 0; rl = 0
    :: atomic {
           /* a call on a handle the scheduler holds:
              ost 0: abort | finish | quarantine; 1 (finished): abort | quarantine;
              2 (aborted): quarantine */
           oh != 0 ->
           if :: (oh & 1) -> i = 0 :: (oh & 2) -> i = 1 fi;
           g = ohg[i];
           if
           :: ost[i] == 0 -> act0 = 2; ost[i] = 2; printf("abort room %d gen %d\n", i, g)
           :: ost[i] == 0 -> act0 = 1; ost[i] = 1; printf("finish room %d gen %d\n", i, g)
#ifndef NO_ABORT_DRAINING
           :: ost[i] == 1 -> act0 = 2; ost[i] = 2; printf("abort (of a finishing room) room %d gen %d\n", i, g)
#endif
#ifndef NO_QUAR
           :: ost[i] != 3 -> act0 = 3; ost[i] = 3; printf("quarantine room %d gen %d\n", i, g)
#endif
           fi;
           nact[i]++;
           if :: (!MORE(ost[i]) || nact[i] >= MAXACT) -> oh = oh & ~B(i); ohg[i] = 0; ost[i] = 0; nact[i] = 0 :: else fi
       };
       if
       :: act0 == 1 -> close(i, g, DRAINING, 0)
       :: act0 == 2 -> close(i, g, ABORTING, 0)
       :: act0 == 3 ->
          /* RoomTable::quarantine(h) */
#ifdef QUAR_MARK_FIRST
          /* MUTATION (the pre-fix quarantine): load the word, store the mark, then close */
          d_step {
              if
              :: (wgen[i] != g || ph[i] == FREE) -> res = STALE
              :: else -> res = OK
              fi
          };
          if
          :: res == OK -> d_step { if :: (qmark[i] > g + 1) :: else -> qmark[i] = g + 1 fi;
                                   printf("quarantine stored its mark (MUTATION: before its close)\n") }
          :: else
          fi;
#endif
          /* RoomWord::quarantine(g): one CAS sets Q and closes the room to Aborting (from
             Owned, Draining or Aborting), releasing it in the same CAS if nothing holds
             it; refused (nothing changes) if stale or in the release gap */
          rl = LC(i, g);
          d_step {
              if
              :: (wgen[i] != g || ph[i] == FREE) -> res = STALE
              :: (CLOSING(i) && holds[i] == 0) -> res = STALE   /* the release gap */
              :: else ->
                 qbit[i] = 1; ph[i] = ABORTING;
                 if
                 :: holds[i] == 0 ->
                    cph = CPH(i); ph[i] = FREE; qbit[i] = 0; wgen[i] = g + 1; res = REL;
                    decide_release(rl)
                 :: else -> res = HELD
                 fi
              fi;
              if
              :: res == STALE ->
                 /* ghost for (e): refused; its lifecycle's release must not say Quarantined */
                 printf("quarantine of room %d gen %d refused: StaleHandle\n", i, g);
                 assert((quaset & B(rl)) == 0);
                 qref = qref | B(rl)
              :: else
              fi
          };
          if
          :: res == REL -> release_to(i, g, cph, 0)
          :: else
          fi;
          cph = 0;
          if
          :: res == HELD ->
                /* give up every pending writer */
                d_step { post = (mgen[i] == g -> mpend[i] : 0) };
                r = 0;
                do
                :: r < NK ->
                   if :: (post >> r) & 1 -> quiesce_in(i, g, r, 0) :: else fi;
                   r++
                :: else -> break
                od;
                r = 0; post = 0;
                /* take_failed(room): one lock section */
                atomic {
                    flock == 0 ->
                    if
                    :: (freg && fidx == i && fgen == g) -> freg = 0; tk = 1;
                       printf("quarantine takes the failed transfer of room %d gen %d\n", i, g)
                    :: else -> tk = 0
                    fi
                };
                if :: tk -> drop_hold(i, g, 2, 0) :: else fi;
                tk = 0;
#ifdef LIVENESS
                d_step {
                    if :: (ph[i] != FREE && wgen[i] == g) -> wdone[i] = morig[i] :: else fi;
                    if :: (xst == 2 && xlc == LC(i, g)) -> xres = 1 :: else fi
                };
#endif
                skip
          :: else
          fi
       fi;
       i = 0; g = 0; act0 = 0; res = 0; rl = 0
    :: break
    od;
    nprod--
}

/* A prefill writer rank: writes into a request's pages until it ACKs; its ACK is
   quiesce(handle, r). Only a live incarnation writes or ACKs. The network may also
   deliver NREPLAY late or duplicate copies of ACKs it sent earlier. */
#define ALIVESET(r) (ALIVE(r, 0) | (ALIVE(r, 1) << 1) | (ALIVE(r, 2) << 2) | (ALIVE(r, 3) << 3) | \
                     (ALIVE(r, 4) << 4) | (ALIVE(r, 5) << 5) | (ALIVE(r, 6) << 6) | (ALIVE(r, 7) << 7))

proctype Rank(byte r) {
    byte i, g, ag, qg, rl, res, p, k, cph, rsn, lc;
    do
    :: atomic {   /* a write of lifecycle lc lands */
           ALIVESET(r) != 0 -> k = ALIVESET(r); pick8(k, lc); k = 0;
           pick_page(lc_pages[lc], p);
           printf("rank %d (incarnation %d) writes page %d for lifecycle %d\n", r, inc[r], p, lc);
           assert(page_lc[p] == lc + 1);        /* (a): the page still belongs to lc */
           lc = 0; p = 0
       }
    :: atomic {   /* drained: ACK, i.e. quiesce(handle of lc, r); first its load */
           ALIVESET(r) != 0 -> k = ALIVESET(r); pick8(k, lc); k = 0;
           act[r] = act[r] & ~B(lc); acked[r] = acked[r] | B(lc);
           i = lc / NG; ag = lc % NG;
           printf("rank %d: drained, ACK for lifecycle %d\n", r, lc);
           QUIESCE_LOAD
       };
       if :: res == OK -> quiesce_in(i, qg, r, 0) :: else fi;
#ifdef LIVENESS
       d_step { if :: (wgen[i] == ag && ph[i] != FREE) -> wdone[i] = wdone[i] | B(r) :: else fi };
#endif
       lc = 0; i = 0; ag = 0; qg = 0; rl = 0; res = 0
    :: atomic {   /* a late or duplicate copy of an earlier ACK arrives */
           replays < NREPLAY && acked[r] != 0 ->
           replays++;
           pick8(acked[r], lc);
           i = lc / NG; ag = lc % NG;
           printf("rank %d: late/duplicate ACK for lifecycle %d arrives\n", r, lc);
           QUIESCE_LOAD
       };
       if :: res == OK -> quiesce_in(i, qg, r, 0) :: else fi;
       lc = 0; i = 0; ag = 0; qg = 0; rl = 0; res = 0
    :: break
    od;
    nprod--
}

/* A local transfer thread: a queued intent names a handle; begin_transfer(_to) checks it;
   while the guard lives it writes the room's pages; then complete(), fail() or drop.
   After a failure its bytes may still land (late writes) while its transport is up. */
proctype Xfer() {
    LOCALS;
    byte n, oc, xq, og;
    bit pr;
    do
    :: atomic {   /* an intent is queued with the room's latest handle (may go stale) */
           (n < NXFER && (pubh[0] != 0 || pubh[1] != 0)) ->
           n++;
           if :: pubh[0] != 0 -> i = 0 :: pubh[1] != 0 -> i = 1 fi;
           g = pubh[i] - 1;
           if :: pr = 0
#ifndef NO_XPEER0
              :: pr = 1
#endif
           fi;
           if :: oc = O_COMPLETE
#ifndef NO_FAIL
              :: oc = O_FAIL
              :: oc = O_DROP
#endif
           fi
       };
       /* begin = RoomWord::begin_transfer: one fetch_add of a transfer unit, then the
          checks on the value it returned (issue 42; under NAIVE_RELEASE the Rust code keeps
          the checked CAS, and so does this model). With peer rank 0 the bytes go over rank
          0's transport as it is now. The integrator does not post over a rank's new
          transport before readmit_rank returned (XFER_BEFORE_READMIT drops that rule). */
       atomic {
#ifndef XFER_BEFORE_READMIT
           (pr == 0 || inc[0] == 0 || readm) ->
#endif
#ifndef NAIVE_RELEASE
           holds[i]++;   /* the unit goes in whatever the word says */
#endif
           if
           :: (ph[i] == OWNED && wgen[i] == g) ->
#ifdef NAIVE_RELEASE
              holds[i]++;
#endif
              res = OK;
              xst = 1; xlc = LC(i, g); xpeer = pr; xinc = inc[0]; xhold = 1;
              printf("begin_transfer on room %d gen %d, peer %d (incarnation %d)\n", i, g, pr, inc[0])
           :: else -> res = REFUSED;
              printf("begin_transfer on room %d gen %d refused (word: phase %d gen %d)\n", i, g, ph[i], wgen[i])
           fi
       };
#ifndef NAIVE_RELEASE
       if
       :: res == REFUSED ->
          /* RoomWord::back_out: one fetch_sub takes the transient unit back; if that took
             a closing room (of whatever generation it is in now) to no hold, the release
             CAS; a release it performs is queued (RoomTable::refused) */
          d_step {
              assert(holds[i] > 0);   /* the unit is still there: nothing erased it */
              holds[i]--; og = wgen[i];
              if :: (holds[i] == 0 && CLOSING(i)) -> res = TRY :: else fi
          };
          if
          :: res == TRY ->
             try_release(i, og);
             if
             :: res == REL ->
                printf("refused begin's take-back released lifecycle %d\n", LC(i, og));
                release_to(i, og, cph, 1)
             :: else
             fi;
             cph = 0
          :: else
          fi;
          res = REFUSED; og = 0
       :: else
       fi;
#endif
       if
       :: res == OK ->
          do
          :: atomic {
                 pick_page(plist[i], p);
                 printf("transfer writes page %d for lifecycle %d\n", p, LC(i, g));
                 assert(page_lc[p] == LC(i, g) + 1);   /* (a) */
                 p = 0
             }
          :: break
          od;
          if
          :: oc == O_COMPLETE ->
             printf("transfer completes\n");
             drop_hold(i, g, 1, 0)
          :: else ->
             /* end_hold(Failed): drop = no outcome (release, if any, queued) */
#ifdef FAILED_AS_DRAINED
             d_step { xst = 2; printf("transfer fails (MUTATION: drops its hold)\n") };
             drop_hold(i, g, 2, (oc == O_DROP))
#else
             atomic {
                 flock == 0 -> flock = 1; xst = 2;
                 printf("transfer fails (outcome %d; 2 = dropped without outcome)\n", oc);
                 xq = qbit[i]   /* our hold keeps the word in our lifecycle */
             };
             d_step {
                 if
                 :: (xq || (xpeer && (fenced & 1))) -> res = DROPNOW;
                    printf("failed transfer: peer fenced or room quarantined: hold dropped\n")
                 :: else -> res = OK;
                    freg = 1; fidx = i; fgen = g; fpeer = xpeer;
                    printf("failed transfer registered (keeps its hold)\n")
                 fi;
                 flock = 0; xq = 0;
#ifdef LIVENESS
                 xfd = 1;
#endif
                 skip
             };
             if :: res == DROPNOW -> drop_hold(i, g, 2, (oc == O_DROP)) :: else fi
#endif
          fi
       :: else
       fi;
       i = 0; g = 0; res = 0; rl = 0; oc = 0; pr = 0
    :: atomic {   /* a late write of the failed transfer lands */
           XALIVE ->
           pick_page(lc_pages[xlc], p);
           printf("late write of the failed transfer lands on page %d (lifecycle %d)\n", p, xlc);
           assert(page_lc[p] == xlc + 1);       /* (a) */
           p = 0
       }
    :: break
    od;
    nprod--
}

/* Failure detector, part 1: tears down rank 0's transport, then fence_rank(0). */
proctype Fencer() {
    LOCALS;
    byte idx, tk, tg;
    bit fx;
    /* teardown; fence_rank: lock fence_lock, insert the rank, fence(SeqCst) */
    atomic {
        fmutex == 0 -> fmutex = 1;
#ifdef LIVENESS
        fx = (xst == 2 && xfd && xpeer);
#endif
        down[0] = 1;
        printf("FD: rank 0's transport (incarnation %d) torn down\n", inc[0]);
        fenced = fenced | 1;
        printf("fence_rank(0): fenced, scanning\n")
    };
    do
    :: idx < NR ->
       /* load room idx's word; FREE rooms are skipped; position(gen, 0) */
       d_step {
           i = idx; idx++;
           if
           :: ph[i] == FREE -> res = STALE
           :: else -> qg = wgen[i]; res = OK;
              printf("fence_rank(0): quiescing rank 0 in room %d gen %d\n", i, qg)
           fi
       };
       if :: res == OK -> quiesce_in(i, qg, 0, 0) :: else fi;
       i = 0; qg = 0; res = 0; rl = 0
    :: else -> break
    od;
    /* take_failed(peer == 0): one lock section; then drop each hold */
    atomic {
        flock == 0 ->
        if
        :: (freg && fpeer) -> freg = 0; tk = fidx; tg = fgen; i = 1;
           printf("fence_rank(0): ends the failed transfer of room %d gen %d\n", tk, tg)
        :: else -> i = 0
        fi
    };
    if :: i -> drop_hold(tk, tg, 2, 0) :: else fi;
    /* fence_rank returns (Fenced::released) and unlocks */
    d_step {
#ifdef LIVENESS
        /* ghosts for (d): rank 0 is done in every lifecycle handed out and live now; the
           failed transfer to rank 0 is resolved */
        if :: (ph[0] != FREE && hnd[0] == wgen[0] + 1) -> wdone[0] = wdone[0] | 1 :: else fi;
        if :: (ph[1] != FREE && hnd[1] == wgen[1] + 1) -> wdone[1] = wdone[1] | 1 :: else fi;
        if :: fx -> xres = 1 :: else fi;
#endif
        fmutex = 0;
        printf("fence_rank(0) returned\n");
        i = 0; tk = 0; tg = 0; idx = 0
    };
    nprod--
}

/* Failure detector, part 2: once rank 0 is fenced, connects its new incarnation, then
   readmit_rank(0) (lock fence_lock, remove, unlock: one step). */
proctype Readmitter() {
    (fenced & 1);
    d_step {
        inc[0] = 1; down[0] = 0;
        printf("FD: new transport for rank 0 (incarnation 1)\n")
    };
#ifdef READMIT_RACE
    d_step { fenced = fenced & ~1; readm = 1; printf("readmit_rank(0) returned (no mutex)\n") }
#else
    atomic { fmutex == 0 -> fenced = fenced & ~1; readm = 1; printf("readmit_rank(0) returned\n") }
#endif
    ;
    nprod--
}

/* A thread draining the release queue: pop_released (count load, word load, fetch_and
   of the bit, count fetch_sub), then deliver from Slot::queued. Stops once every producer
   has ended and the queue is empty. */
proctype Drainer() {
    byte i, p, k, l, bits;
    bit got;
    do
    :: atomic { qcount != 0 -> bits = qbits };
       if
       :: bits != 0 ->
          if :: (bits & 1) -> i = 0 :: else -> i = 1 fi;
#ifdef RACY_POP
          /* MUTATION: store of the loaded bits without the one, not an RMW */
          d_step { qbits = bits & ~B(i); qcount--; got = 1 };
#else
          d_step {
              if
              :: (qbits & B(i)) -> qbits = qbits & ~B(i); qcount--; got = 1
              :: else -> got = 0
              fi
          };
#endif
          if
          :: got ->
             d_step {
                 l = LC(i, qgen[i]);
                 printf("drainer pops room %d\n", i);
                 deliver_tail(i, l, qrsn[i]);
                 l = 0
             }
          :: else
          fi
       :: else
       fi;
       i = 0; got = 0; bits = 0
    :: (nprod == 0 && qcount == 0) -> break
    od
}

init {
    byte k, cnt, p;
    atomic {
        nprod = 1;
        run Opener();
        nprod++; run Rank(0);
#ifndef NO_RANK1
        nprod++; run Rank(1);
#endif
#if NXFER > 0
        nprod++; run Xfer();
#endif
#ifndef NO_FENCE
        nprod++; run Fencer();
        nprod++; run Readmitter();
#endif
#if NDRAIN >= 1
        run Drainer();
#endif
#if NDRAIN >= 2
        run Drainer();
#endif
        skip
    };
    /* quiescence: every other process has ended */
    (_nr_pr == 1);
    d_step {
        /* (b): the queue is empty; every release decided was delivered (exactly once:
           deliver_tail asserts it) */
        assert(qbits == 0 && qcount == 0);
        assert(relset == delset);
        /* (c): free + owned + quarantined == capacity, for pages; free + claimed, rooms */
        cnt = 0; p = 0;
        do
        :: p < NP -> cnt = cnt + ((pfree >> p) & 1) + ((qpages >> p) & 1); p++
        :: else -> break
        od;
        k = 0;
        do
        :: k < NR ->
           if
           :: ph[k] != FREE ->
              p = 0;
              do
              :: p < NP -> cnt = cnt + ((plist[k] >> p) & 1); p++
              :: else -> break
              od
           :: else -> assert(plist[k] == 0)
           fi;
           k++
        :: else -> break
        od;
        assert(cnt == NP);
        cnt = (rfree & 1) + ((rfree >> 1) & 1) + (ph[0] != FREE -> 1 : 0) + (ph[1] != FREE -> 1 : 0);
        assert(cnt == NR);
        printf("quiescent: releases %d delivered %d, quarantined pages %d; conserved\n", relset, delset, qpages)
    }
}
