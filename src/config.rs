//! [`Config`]: a table's mode and sizes, fixed at construction.

use crate::error::Error;
use crate::handle::MAX_ROOMS;

/// The largest page pool (page ids are `u32`, and the pool's bitmap is indexed by them).
pub const MAX_PAGES: usize = 1 << 31;

/// How a [`RoomTable`](crate::RoomTable) is made: its mode, sizes and how releases are
/// delivered.
///
/// * **Gate mode** ([`Config::gate`]): the engine owns its pages. `open_gate` takes the
///   engine's opaque token and page ids; a release hands both back, exactly once, and the
///   engine frees the pages with its own allocator. kvfence allocates no page.
/// * **Pool mode** ([`Config::pool`]): kvfence owns a pool of `pages` pages (ids
///   `0..pages`); `open` claims them all-or-nothing and a release returns them.
///
/// Releases are returned by the call that performs them, or, with
/// [`release_queue`](Self::release_queue), all delivered through
/// [`RoomTable::drain_released`](crate::RoomTable::drain_released), for an engine whose
/// scheduler thread must act on them.
///
/// ```
/// use kvfence::Config;
/// let engine = Config::gate(4096).release_queue(true);     // SGLang/vLLM style
/// let owned = Config::pool(1024, 65536);                   // kvfence owns the pages
/// assert_eq!(engine.pages, None);
/// assert_eq!(owned.pages, Some(65536));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    /// Rooms (concurrent requests), `1..=2^24`.
    pub rooms: usize,
    /// `None`: gate mode. `Some(n)`: a pool of `n` pages, `1..=2^31`.
    pub pages: Option<usize>,
    /// `true`: every release goes to the release queue (calls that perform one return
    /// `None` / [`Quiesced::Queued`](crate::Quiesced::Queued)).
    pub release_queue: bool,
    /// How many ranks can be fenced at once (`1..=65536`; default 256).
    pub max_fenced: usize,
    /// Transfers begun with [`RoomTable::begin`](crate::RoomTable::begin) (token form) in flight at once
    /// (`1..=2^24`; default 4 per room, at most 2^24).
    pub max_tokens: usize,
}

impl Config {
    /// A gate-mode table of `rooms` rooms (the engine owns the pages).
    pub const fn gate(rooms: usize) -> Config {
        Config {
            rooms,
            pages: None,
            release_queue: false,
            max_fenced: 256,
            max_tokens: if rooms.saturating_mul(4) > MAX_ROOMS {
                MAX_ROOMS
            } else {
                rooms * 4
            },
        }
    }

    /// A pool-mode table of `rooms` rooms and `pages` pages owned by kvfence.
    pub const fn pool(rooms: usize, pages: usize) -> Config {
        Config {
            pages: Some(pages),
            ..Config::gate(rooms)
        }
    }

    /// Delivers every release through the release queue (see the type docs).
    pub const fn release_queue(mut self, on: bool) -> Config {
        self.release_queue = on;
        self
    }

    /// Sets [`max_fenced`](Self::max_fenced).
    pub const fn max_fenced(mut self, n: usize) -> Config {
        self.max_fenced = n;
        self
    }

    /// Sets [`max_tokens`](Self::max_tokens).
    pub const fn max_tokens(mut self, n: usize) -> Config {
        self.max_tokens = n;
        self
    }

    pub(crate) fn check(&self) -> Result<(), Error> {
        let bad = |reason| Err(Error::InvalidConfig { reason });
        if self.rooms == 0 || self.rooms > MAX_ROOMS {
            return bad("rooms must be in 1..=16777216 (2^24)");
        }
        if let Some(pages) = self.pages {
            if pages == 0 || pages > MAX_PAGES {
                return bad("pages must be in 1..=2147483648 (2^31), or None for gate mode");
            }
        }
        if self.max_fenced == 0 || self.max_fenced > 1 << 16 {
            return bad("max_fenced must be in 1..=65536");
        }
        if self.max_tokens == 0 || self.max_tokens > MAX_ROOMS {
            return bad("max_tokens must be in 1..=16777216 (2^24)");
        }
        Ok(())
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_limits_at_their_boundaries() {
        // Default token capacity: 4 per room, capped at 2^24.
        assert_eq!(Config::gate(8).max_tokens, 32);
        assert_eq!(Config::gate(MAX_ROOMS / 4).max_tokens, MAX_ROOMS);
        assert_eq!(Config::gate(MAX_ROOMS / 4 + 1).max_tokens, MAX_ROOMS);
        assert_eq!(Config::gate(MAX_ROOMS).max_tokens, MAX_ROOMS);
        assert!(Config::gate(MAX_ROOMS).check().is_ok());
        // Each limit is inclusive.
        assert!(Config::gate(1).max_fenced(1 << 16).check().is_ok());
        assert!(Config::gate(1).max_fenced((1 << 16) + 1).check().is_err());
        assert!(Config::gate(1).max_fenced(0).check().is_err());
        assert!(Config::gate(1).max_tokens(MAX_ROOMS).check().is_ok());
        assert!(Config::gate(1).max_tokens(MAX_ROOMS + 1).check().is_err());
        assert!(Config::gate(1).max_tokens(0).check().is_err());
        assert!(Config::pool(1, MAX_PAGES).check().is_ok());
        assert!(Config::pool(1, MAX_PAGES + 1).check().is_err());
        assert!(Config::pool(1, 0).check().is_err());
        assert!(Config::gate(MAX_ROOMS + 1).check().is_err());
    }
}
