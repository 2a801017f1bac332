/*
 * kvfence.pml -- a Promela model of kvfence's release protocol, checked with SPIN.
 *
 * Models src/room_word.rs (the room word), src/writers.rs (the mask word), src/table.rs
 * (open, begin_transfer, end_transfer, abort, finish, quiesce, fence_rank, readmit_rank,
 * release, orphans) and src/guard.rs (complete vs. drop), with the fence mutex of the
 * fix: fence_rank holds it for its whole scan and readmit_rank takes it too.
 * README.md (next to this file) maps every process, variable and step to the Rust code
 * and says what is abstracted away.
 *
 * Memory model: SPIN interleaves whole steps, so it checks sequentially consistent
 * executions only. Each atomic load, store, CAS, fetch_sub or fetch_or of the Rust code
 * is one step (a d_step / atomic block); fence(SeqCst) is a no-op. Weak memory is loom's
 * job (loom-tests/).
 *
 * Sizes: 2 rooms, 2 writer ranks, 3 pages; at most NOPEN opens per run (so generations
 * 0..NOPEN-1), NXFER local transfers, NREPLAY late/duplicate ACKs, one fence/readmit
 * cycle of rank 0 (rank 1 is never fenced).
 *
 * Checked:
 *  (a) assert: a write stamped with lifecycle L lands only on a page that belongs to L,
 *      and no page goes back to the pool while a live TransferGuard or a live rank
 *      incarnation still holds a request naming it;
 *  (b) assert: each lifecycle's release is decided at most once, delivered at most once,
 *      only if decided; at quiescence every decided release was delivered;
 *  (c) assert: after every step that changes a bitmap or the page owners, each page is in
 *      the pool xor owned by one lifecycle and a claimed (non-FREE) room is not in the
 *      room bitmap; at quiescence free + owned + held == capacity for pages and rooms;
 *  (d) ltl live (compile with -DLIVENESS, run pan -a -f): a closing room whose writers
 *      all ACKed or were fenced and whose transfers all ended is eventually released.
 *
 * Variants (-D...), each must break a property:
 *   NAIVE_RELEASE      abort releases at once ("free at abort")                     (a)
 *   READMIT_RACE       readmit_rank does not take the fence mutex (the old code)    (a)
 *   SKIP_ACK_GEN_CHECK quiesce trusts the room word's generation, not the handle's  (a)
 *   SEND_AT_RETURN     the integrator sends a room to the rank incarnation current
 *                      when open() returns instead of when it was called            (a)
 *   RELOAD_DROP        drop_hold decides the release from a fresh load instead of
 *                      the fetch_sub's returned value                              (b)
 *   NO_OPEN_RECHECK    open does not re-read the fenced bits after publishing       (d)
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

/* Phase (room_word.rs, Phase::bits) */
#define FREE     0
#define OWNED    1
#define ABORTING 2
#define DRAINING 3

/* outcome of one modelled call */
#define OK      0
#define STALE   1   /* Refusal::Stale, MaskRefusal::Stale, Error::StaleHandle */
#define PHASE   2   /* Refusal::Phase (AlreadyAborted / AlreadyFinished / RoomClosed) */
#define NOTIN   3   /* MaskRefusal::NotInRoom */
#define DUP     4   /* Cleared::Duplicate */
#define BITCLR  5   /* Cleared::Bit */
#define LAST    6   /* Cleared::LastOfWord: the caller now owns the word's hold */
#define HELD    7   /* Step::Held */
#define REL     8   /* Step::Released: this call won the release */
#define REFUSED 9   /* open refused (RankFenced, RoomTableFull, PoolExhausted), begin refused */

/* who receives a release this call performs */
#define H_RET   0   /* the call's return value (abort, finish, quiesce, complete) */
#define H_ACK   1   /* a rank's ACK (quiesce): return value; also the liveness ghost */
#define H_ORPH  2   /* RoomTable::orphan (guard dropped, or open's own quiesce) */
#define H_FENCE 3   /* the Fenced::released list fence_rank returns */

#define LC(i, g)   ((i) * NG + (g))     /* lifecycle id: room i, generation g */
#define B(x)       (1 << (x))
#define CLOSING(i) (ph[i] == ABORTING || ph[i] == DRAINING)

/* ------------------------------------------------------------ the table (src/) */
byte ph[NR];        /* room word: phase   (RoomWord, room_word.rs) */
byte holds[NR];     /* room word: holds */
byte wgen[NR];      /* room word: generation */
byte mgen[NR];      /* mask word: generation (MaskWord, writers.rs) */
byte morig[NR];     /* mask word: original ranks */
byte mpend[NR];     /* mask word: pending ranks */
byte rfree = 3;     /* RoomTable::rooms_free (Bitmap; 1 = free) */
byte pfree = (1 << NP) - 1;  /* RoomTable::pages_free */
byte plist[NR];     /* Slot::pages, the UnsafeCell page list, as a page set */
byte fenced;        /* RoomTable::fenced */
bit  fmutex;        /* the fix: the fence mutex */
byte orph;          /* RoomTable::orphans, as a set of lifecycle ids */

/* ------------------------------------------------------------ the environment */
byte inc[NK];       /* rank r's current transport incarnation */
bit  down[NK];      /* rank r's current transport is torn down */
byte act[NK];       /* lifecycles rank r was sent and has not ACKed */
byte ainc[NK];      /* ... the incarnation each was sent to (one bit: 0 or 1) */
byte acked[NK];     /* lifecycles rank r has ACKed (their ACK may be replayed) */
byte pubh[NR];      /* latest handle of room i known to the transfer thread (gen + 1) */
byte replays;       /* late/duplicate ACKs delivered so far */

/* ------------------------------------------------------------ ghost state */
byte page_lc[NP];       /* lifecycle owning each page, + 1; 0 = in the pool */
byte lc_pages[2 * NG];  /* each lifecycle's pages (fixed once published) */
byte relset;            /* lifecycles whose release was decided */
byte delset;            /* lifecycles whose release event was delivered */
byte xlive[NR];         /* TransferGuards of room i that still hold it */
#ifdef LIVENESS
byte wdone[NR];         /* ranks of room i's lifecycle known done: ACK returned, or a
                           fence_rank of the rank returned (see Fencer) */
bit  opening;           /* an open() call is in progress */
byte open_cov;          /* ranks whose fence_rank returned during that open() */
#endif

/* a live incarnation of rank r holds the request of lifecycle k */
#define ALIVE(r, k) (((act[r] >> (k)) & 1) && !down[r] && (((ainc[r] >> (k)) & 1) == inc[r]))

/* (c) per step: a page is in the pool xor owned by one lifecycle; a room that is not
   FREE is claimed in the room bitmap */
#define PAGE_OK(p) ((((pfree >> (p)) & 1) == 1) != (page_lc[p] != 0))
#define ROOM_OK(i) (ph[i] == FREE || ((rfree >> (i)) & 1) == 0)
#if NP == 3
#define INVARIANT  (PAGE_OK(0) && PAGE_OK(1) && PAGE_OK(2) && ROOM_OK(0) && ROOM_OK(1))
#else
#define INVARIANT  (PAGE_OK(0) && PAGE_OK(1) && ROOM_OK(0) && ROOM_OK(1))
#endif

#ifdef LIVENESS
/* (d) */
#define DRAINED(i) (CLOSING(i) && (morig[i] & ~wdone[i]) == 0 && xlive[i] == 0)
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

/* (b) a release event reaches the application: only if decided, at most once */
inline deliver(l) {
    printf("release event of lifecycle %d delivered\n", l);
    assert((relset & B(l)) != 0);
    assert((delset & B(l)) == 0);
    delset = delset | B(l)
}

/* end of a call: route a release it performed (lifecycle rl) to its receiver */
inline epilogue() {
    if
    :: res == REL ->
       if
       :: how == H_ORPH  -> orph = orph | B(rl);
          printf("release of lifecycle %d pushed to the orphan list\n", rl)
       :: how == H_FENCE -> rels = rels | B(rl)
       :: else -> deliver(rl)
       fi
    :: else
    fi;
#ifdef LIVENESS
    if
    :: (how == H_ACK && wgen[i] == ag && ph[i] != FREE) -> wdone[i] = wdone[i] | B(r)
    :: else
    fi
#endif
}

/* RoomTable::release after the deciding RMW: pages back (fetch_or on the page bitmap),
   room index back (fetch_or on the room bitmap) -- merged into one step here.
   (a): no page goes back while a live guard or a live rank incarnation can write it. */
inline release_tail(i, l) {
    d_step {
        printf("release of lifecycle %d: pages %d back to the pool, room %d free\n", l, plist[i], i);
        assert(xlive[i] == 0);
        assert((pfree & plist[i]) == 0);
        assert(((rfree >> i) & 1) == 0);
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
              page_lc[p] = 0
           :: else
           fi;
           p++
        :: else -> break
        od;
        pfree = pfree | plist[i];
        rfree = rfree | B(i);
        p = 0; k = 0;
        assert(INVARIANT);
        epilogue()
    }
}

/* RoomWord::drop_hold(g) for a hold the caller owns (x = 1: a TransferGuard's hold).
   res becomes HELD or REL (STALE only under NAIVE_RELEASE's checked CAS). */
inline drop_hold(i, g, x) {
    rl = LC(i, g);
#if defined(NAIVE_RELEASE)
    /* under the mutation the Rust code uses drop_hold_checked: one CAS */
    d_step {
        xlive[i] = xlive[i] - x;
        if
        :: (wgen[i] != g || ph[i] == FREE || holds[i] == 0) -> res = STALE
        :: else ->
           holds[i]--;
           if
           :: (holds[i] == 0 && CLOSING(i)) ->
              ph[i] = FREE; wgen[i] = g + 1; res = REL; decide_release(rl)
           :: else -> res = HELD
           fi
        fi;
        if :: res != REL -> epilogue() :: else fi
    };
#elif defined(RELOAD_DROP)
    /* MUTATION: fetch_sub, then decide from a fresh load, not from its returned value */
    d_step {
        assert(wgen[i] == g && holds[i] > 0 && ph[i] != FREE);
        holds[i]--; xlive[i] = xlive[i] - x
    };
    d_step {
        if
        :: (holds[i] == 0 && CLOSING(i)) -> res = REL; decide_release(rl)
        :: else -> res = HELD; epilogue()
        fi
    };
    if
    :: res == REL -> d_step { ph[i] = FREE; holds[i] = 0; wgen[i] = g + 1 }
    :: else
    fi;
#else
    /* one fetch_sub: the value it returns decides */
    d_step {
        assert(wgen[i] == g && holds[i] > 0 && ph[i] != FREE);   /* its debug_assert */
        holds[i]--; xlive[i] = xlive[i] - x;
        if
        :: (holds[i] == 0 && CLOSING(i)) -> res = REL; decide_release(rl)
        :: else -> res = HELD; epilogue()
        fi
    };
    if
    :: res == REL ->
       /* the plain store of FREE, gen + 1: the word must still be frozen */
       d_step {
           assert(holds[i] == 0 && wgen[i] == g && CLOSING(i));
           ph[i] = FREE; wgen[i] = g + 1
       }
    :: else
    fi;
#endif
    if
    :: res == REL -> release_tail(i, rl)
    :: else
    fi
}

/* RoomTable::quiesce_in(i, qg, r): MaskWord::clear (one CAS); if that emptied the word,
   drop the word's hold (which may release) */
inline quiesce_in(i, qg, r) {
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
        fi;
        if :: res != LAST -> epilogue() :: else fi
    };
    if
    :: res == LAST -> drop_hold(i, qg, 0)
    :: else
    fi
}

/* RoomTable::quiesce((i, ag), r): load the room word (stale unless same generation and
   not FREE), then quiesce_in. The first step is merged with the caller's preceding step. */
#ifdef SKIP_ACK_GEN_CHECK
#define QUIESCE_LOAD  qg = wgen[i]; res = OK     /* MUTATION: trust the word's generation */
#else
#define QUIESCE_LOAD  if :: (wgen[i] != ag || ph[i] == FREE) -> res = STALE; epilogue() \
                         :: else -> qg = ag; res = OK fi
#endif

/* RoomTable::close(i, g, to) = RoomWord::close (one CAS), then the tail if it released */
inline close(i, g, to) {
    rl = LC(i, g);
    d_step {
        if
        :: (wgen[i] != g || ph[i] == FREE) -> res = STALE
        :: else ->
           if
           :: ph[i] != OWNED -> res = PHASE
           :: else ->
#ifdef NAIVE_RELEASE
              if
              :: to == ABORTING -> holds[i] = 0     /* MUTATION: free the pages at abort */
              :: else
              fi;
#endif
              if
              :: holds[i] == 0 ->
                 ph[i] = FREE; wgen[i] = g + 1; res = REL; decide_release(rl)
              :: else -> ph[i] = to; res = HELD
              fi
           fi
        fi;
        if :: res != REL -> epilogue() :: else fi
    };
    if
    :: res == REL -> release_tail(i, rl)
    :: else
    fi
}

/* ------------------------------------------------------------ processes */

/* The decode scheduler thread: open, abort, finish, take_orphaned. */
proctype Opener() {
    byte opens, w, n, i, g, ag, qg, lc, rl, res, how, p, k, r, to, snap, post, taken, oh, rels;
    byte ohg[NR];
    do
    :: opens < NOPEN ->
       /* open(n pages, writers w): the up-front check of the fenced bits */
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
#ifdef LIVENESS
           opening = 1; open_cov = 0;
#endif
#ifndef SEND_AT_RETURN
           snap = inc[0];   /* the rank-0 incarnation the request will be sent to */
#endif
           if
           :: (w & fenced) != 0 -> res = REFUSED;
              printf("open(writers %d, %d pages): refused, a writer is fenced\n", w, n)
           :: else -> res = OK
           fi
       };
       if :: res != OK -> goto open_out :: else fi;
       /* claim a room index (CAS on the room bitmap, any free index), claim n pages all or
          nothing (CAS on the page bitmap, lowest first), read the generation, stamp the
          mask word, publish the room word OWNED with holds = nonempty mask words.
          One step: nothing else can observe the room before the publish (see README). */
       atomic {
           if
           :: (rfree & 1) -> i = 0
           :: (rfree & 2) -> i = 1
           :: rfree == 0 -> res = REFUSED
           fi;
           if
           :: res == OK ->
                  lc = LC(i, wgen[i]);
                  assert(wgen[i] < NG && ph[i] == FREE && holds[i] == 0);
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
                     ph[i] = OWNED; holds[i] = (w != 0 -> 1 : 0);
                     lc_pages[lc] = plist[i];
#ifdef LIVENESS
                     wdone[i] = 0;
#endif
                     printf("open: room %d gen %d (lifecycle %d), writers %d, pages %d\n", i, g, lc, w, plist[i]);
                     assert(INVARIANT)
                  :: else -> res = REFUSED;
                     printf("open: pool exhausted\n")
                  fi;
                  p = 0; k = 0; taken = 0
           :: else -> printf("open: room table full\n")
           fi
       };
       if :: res != OK -> goto open_out :: else fi;
#ifndef NO_OPEN_RECHECK
       /* fence(SeqCst); re-read the fenced bits */
       d_step { post = w & fenced };
       r = 0;
       do
       :: r < NK ->
          if
          :: (post >> r) & 1 ->
             printf("open: rank %d was fenced meanwhile: open quiesces it in room %d\n", r, i);
             how = H_ORPH;
             quiesce_in(i, g, r);
             how = 0
          :: else
          fi;
          r++
       :: else -> break
       od;
       r = 0; post = 0;
#endif
       /* open returns. The scheduler sends the request to each writer over the
          connection it had when it called open(); if rank 0's connection was replaced
          meanwhile it does not send, and quiesces rank 0 itself (that rank never got the
          request). It keeps the handle and hands it to the transfer thread. */
       d_step {
#ifdef SEND_AT_RETURN
           snap = inc[0];   /* MUTATION (integrator): send over the connection current now */
#endif
           if
           :: ((w & 1) && inc[0] == snap) ->
              act[0] = act[0] | B(lc);
              if :: snap -> ainc[0] = ainc[0] | B(lc) :: else -> ainc[0] = ainc[0] & ~B(lc) fi;
              printf("request of lifecycle %d sent to rank 0, incarnation %d\n", lc, snap)
           :: ((w & 1) && inc[0] != snap) -> post = 1;
              printf("rank 0's connection changed during open: not sent; scheduler quiesces rank 0\n")
           :: else
           fi;
           if :: w & 2 -> act[1] = act[1] | B(lc) :: else fi;
           pubh[i] = g + 1;
           oh = oh | B(i); ohg[i] = g;
#ifdef LIVENESS
           wdone[i] = wdone[i] | (open_cov & w);
#endif
           snap = 0
       };
       if
       :: post ->
          how = H_ACK; r = 0; ag = g;
          d_step { QUIESCE_LOAD };
          if :: res == OK -> quiesce_in(i, qg, 0) :: else fi;
          how = 0; post = 0; ag = 0; r = 0
       :: else
       fi;
open_out: skip;
#ifdef LIVENESS
       d_step { opening = 0; open_cov = 0 };
#endif
       w = 0; n = 0; i = 0; g = 0; lc = 0; res = 0; qg = 0; rl = 0; snap = 0
    :: atomic {
           oh != 0 ->
           if :: (oh & 1) -> i = 0 :: (oh & 2) -> i = 1 fi;
           g = ohg[i]; oh = oh & ~B(i); ohg[i] = 0;
           if
           :: to = ABORTING; printf("abort room %d gen %d\n", i, g)
           :: to = DRAINING; printf("finish room %d gen %d\n", i, g)
           fi
       };
       how = H_RET;
       close(i, g, to);
       i = 0; g = 0; to = 0; res = 0; rl = 0
    :: d_step {
           orph != 0 ->
           printf("take_orphaned\n");
           k = 0;
           do
           :: k < 2 * NG -> if :: (orph >> k) & 1 -> deliver(k) :: else fi; k++
           :: else -> break
           od;
           orph = 0; k = 0
       }
    :: break
    od
}

/* A prefill writer rank: writes into a request's pages until it ACKs; its ACK is
   quiesce(handle, r). Only a live incarnation writes or ACKs. The network may also
   deliver NREPLAY late or duplicate copies of ACKs it sent earlier. */
#define ALIVESET(r) (ALIVE(r, 0) | (ALIVE(r, 1) << 1) | (ALIVE(r, 2) << 2) | (ALIVE(r, 3) << 3) | \
                     (ALIVE(r, 4) << 4) | (ALIVE(r, 5) << 5) | (ALIVE(r, 6) << 6) | (ALIVE(r, 7) << 7))

proctype Rank(byte r) {
    byte lc, p, k, i, ag, qg, rl, res, how, rels;
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
           i = lc / NG; ag = lc % NG; how = H_ACK;
           printf("rank %d: drained, ACK for lifecycle %d\n", r, lc);
           QUIESCE_LOAD
       };
       if :: res == OK -> quiesce_in(i, qg, r) :: else fi;
       lc = 0; i = 0; ag = 0; qg = 0; rl = 0; res = 0; how = 0
    :: atomic {   /* a late or duplicate copy of an earlier ACK arrives */
           replays < NREPLAY && acked[r] != 0 ->
           replays++;
           pick8(acked[r], lc);
           i = lc / NG; ag = lc % NG; how = H_RET;
           printf("rank %d: late/duplicate ACK for lifecycle %d arrives\n", r, lc);
           QUIESCE_LOAD
       };
       if :: res == OK -> quiesce_in(i, qg, r) :: else fi;
       lc = 0; i = 0; ag = 0; qg = 0; rl = 0; res = 0; how = 0
    :: break
    od
}

/* A local transfer thread: a queued intent names a handle; later begin_transfer checks it;
   while the guard lives it writes the room's pages; then complete() or drop. */
proctype Xfer() {
    byte n, i, g, ag, qg, rl, p, k, r, res, how, rels;
    do
    :: atomic {   /* an intent is queued with the room's latest handle (may go stale) */
           (n < NXFER && (pubh[0] != 0 || pubh[1] != 0)) ->
           n++;
           if :: pubh[0] != 0 -> i = 0 :: pubh[1] != 0 -> i = 1 fi;
           g = pubh[i] - 1;
           if :: how = H_RET :: how = H_ORPH fi    /* complete(), or dropped */
       };
       /* begin_transfer = RoomWord::begin (one CAS) */
       d_step {
           if
           :: (ph[i] == OWNED && wgen[i] == g) ->
              holds[i]++; xlive[i]++; res = OK;
              printf("begin_transfer on room %d gen %d\n", i, g)
           :: else -> res = REFUSED;
              printf("begin_transfer on room %d gen %d refused\n", i, g)
           fi
       };
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
          /* complete() / Drop: end_transfer = drop_hold */
          drop_hold(i, g, 1)
       :: else
       fi;
       i = 0; g = 0; res = 0; rl = 0; how = 0
    :: break
    od
}

/* Failure detector, part 1: tears down rank 0's transport, then fence_rank(0). */
proctype Fencer() {
    byte idx, i, ag, qg, rl, p, k, r, res, how, rels;
    /* teardown; fence_rank: lock the mutex, fetch_or the fenced bit, fence(SeqCst) */
    atomic {
#ifndef READMIT_RACE
        fmutex == 0 -> fmutex = 1;
#endif
        down[0] = 1;
        printf("FD: rank 0's transport (incarnation %d) torn down\n", inc[0]);
        fenced = fenced | 1;
        printf("fence_rank(0): fenced bit set, scanning\n")
    };
    how = H_FENCE;
    do
    :: idx < NR ->
       /* load room idx's word; FREE rooms are skipped */
       d_step {
           i = idx; idx++;
           if
           :: ph[i] == FREE -> res = STALE
           :: else -> qg = wgen[i]; res = OK;
              printf("fence_rank(0): quiescing rank 0 in room %d gen %d\n", i, qg)
           fi
       };
       if :: res == OK -> quiesce_in(i, qg, 0) :: else fi;
       i = 0; qg = 0; res = 0; rl = 0
    :: else -> break
    od;
    skip;
    /* fence_rank returns its releases and unlocks */
    d_step {
        k = 0;
        do
        :: k < 2 * NG -> if :: (rels >> k) & 1 -> deliver(k) :: else fi; k++
        :: else -> break
        od;
#ifdef LIVENESS
        /* ghost for (d): rank 0 is done in every lifecycle live now, and in one being opened */
        if :: ph[0] != FREE -> wdone[0] = wdone[0] | 1 :: else fi;
        if :: ph[1] != FREE -> wdone[1] = wdone[1] | 1 :: else fi;
        if :: opening -> open_cov = open_cov | 1 :: else fi;
#endif
#ifndef READMIT_RACE
        fmutex = 0;
#endif
        printf("fence_rank(0) returned\n");
        k = 0; rels = 0; idx = 0; how = 0
    }
}

/* Failure detector, part 2: once rank 0 is fenced, connects its new incarnation, then
   readmit_rank(0) (with the fix: lock, clear the bit, unlock -- one step). */
proctype Readmitter() {
    (fenced & 1);
    d_step {
        inc[0] = 1; down[0] = 0;
        printf("FD: new transport for rank 0 (incarnation 1)\n")
    };
#ifdef READMIT_RACE
    d_step { fenced = fenced & ~1; printf("readmit_rank(0) returned (no mutex)\n") }
#else
    atomic { fmutex == 0 -> fenced = fenced & ~1; printf("readmit_rank(0) returned\n") }
#endif
}

init {
    byte k, cnt, p;
    atomic {
        run Opener();
        run Rank(0);
#ifndef NO_RANK1
        run Rank(1);
#endif
        run Xfer();
#ifndef NO_FENCE
        run Fencer();
        run Readmitter()
#else
        skip
#endif
    };
    /* quiescence: every other process has ended */
    (_nr_pr == 1);
    d_step {
        /* the owner drains the orphan list one last time */
        k = 0;
        do
        :: k < 2 * NG -> if :: (orph >> k) & 1 -> deliver(k) :: else fi; k++
        :: else -> break
        od;
        orph = 0;
        /* (b): every release decided was delivered (exactly once: deliver asserts it) */
        assert(relset == delset);
        /* (c): free + owned + held == capacity, for pages and for rooms */
        cnt = 0; p = 0;
        do
        :: p < NP -> cnt = cnt + ((pfree >> p) & 1); p++
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
           :: else
           fi;
           k++
        :: else -> break
        od;
        assert(cnt == NP);
        cnt = (rfree & 1) + ((rfree >> 1) & 1) + (ph[0] != FREE -> 1 : 0) + (ph[1] != FREE -> 1 : 0);
        assert(cnt == NR);
        printf("quiescent: releases %d delivered %d; pages and rooms conserved\n", relset, delset)
    }
}
