//! The decode node's page arena: real memory that prefill threads write into.
//!
//! Pages are arrays of `AtomicU64` words written with `Relaxed` stores: several threads write
//! the arena at once (that is the point: a stale writer and a page's new owner), and with
//! atomics a stale write is a real, observable overwrite instead of undefined behaviour.
//! `Relaxed` compiles to plain moves on x86-64 and AArch64.
//!
//! Every word has an expected value derived from `(request id, page, offset)`
//! ([`pattern`]), so any page can be checked against the request that is supposed to own it.

use crate::rng::mix;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// The word a request writes at `offset` (in words) of page `page`.
#[inline]
pub fn pattern(req: u64, page: u32, offset: usize) -> u64 {
    word(page_seed(req, page), offset)
}

#[inline]
fn page_seed(req: u64, page: u32) -> u64 {
    mix(req.wrapping_mul(0xD6E8_FEB8_6659_FD93) ^ mix(u64::from(page) + 1))
}

#[inline]
fn word(seed: u64, offset: usize) -> u64 {
    seed ^ (offset as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// A page arena: `pages` pages of `page_bytes` bytes each.
#[derive(Debug)]
pub struct Arena {
    words_per_page: usize,
    words: Box<[AtomicU64]>,
}

impl Arena {
    /// An arena of `pages` zeroed pages of `page_bytes` bytes (a positive multiple of 8).
    pub fn new(pages: usize, page_bytes: usize) -> Arena {
        let words_per_page = (page_bytes / 8).max(1);
        Arena {
            words_per_page,
            words: (0..pages * words_per_page)
                .map(|_| AtomicU64::new(0))
                .collect(),
        }
    }

    /// Pages in the arena.
    pub fn pages(&self) -> usize {
        self.words.len() / self.words_per_page
    }

    fn page(&self, page: u32) -> &[AtomicU64] {
        let start = page as usize * self.words_per_page;
        &self.words[start..start + self.words_per_page]
    }

    /// Writes request `req`'s KV for `page` (the one-sided write of a chunk).
    pub fn write_page(&self, page: u32, req: u64) {
        let seed = page_seed(req, page);
        for (offset, w) in self.page(page).iter().enumerate() {
            w.store(word(seed, offset), Relaxed);
        }
    }

    /// Whether `page` holds exactly request `req`'s KV.
    pub fn verify_page(&self, page: u32, req: u64) -> bool {
        let seed = page_seed(req, page);
        self.page(page)
            .iter()
            .enumerate()
            .all(|(offset, w)| w.load(Relaxed) == word(seed, offset))
    }

    /// Stores `value` in one word (tests: a partial, torn overwrite).
    pub fn poke(&self, page: u32, offset: usize, value: u64) {
        self.page(page)[offset].store(value, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_written_page_verifies_for_its_request_only() {
        let arena = Arena::new(4, 4096);
        assert_eq!(arena.pages(), 4);
        assert!(
            !arena.verify_page(1, 7),
            "a zeroed page is not request 7's KV"
        );
        arena.write_page(1, 7);
        assert!(arena.verify_page(1, 7));
        assert!(!arena.verify_page(1, 8));
        assert!(!arena.verify_page(2, 7), "untouched neighbour");
    }

    #[test]
    fn a_stale_overwrite_is_detected() {
        let arena = Arena::new(2, 64);
        arena.write_page(0, 1);
        arena.write_page(0, 2); // request 1's page reused by 2... then 1's stale write lands:
        assert!(arena.verify_page(0, 2));
        arena.write_page(0, 1);
        assert!(!arena.verify_page(0, 2));
    }

    #[test]
    fn a_single_torn_word_is_detected() {
        let arena = Arena::new(1, 4096);
        arena.write_page(0, 5);
        arena.poke(0, 511, pattern(6, 0, 511));
        assert!(!arena.verify_page(0, 5));
        arena.poke(0, 511, pattern(5, 0, 511));
        assert!(arena.verify_page(0, 5));
    }

    #[test]
    fn pattern_depends_on_request_page_and_offset() {
        let base = pattern(1, 1, 1);
        assert_ne!(base, pattern(2, 1, 1));
        assert_ne!(base, pattern(1, 2, 1));
        assert_ne!(base, pattern(1, 1, 2));
        assert_eq!(base, pattern(1, 1, 1));
    }
}
