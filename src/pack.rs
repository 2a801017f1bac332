//! Bit fields packed into one `u64`.
//!
//! Both atomic words of the crate (the room word and the writer-mask words) are several
//! fields that must change together in one CAS. A [`Field`] names one field's position
//! once, so every shift and mask in the crate is written in exactly one place.

/// A run of `bits` bits starting at bit `shift` of a `u64`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Field {
    shift: u32,
    bits: u32,
}

impl Field {
    /// A field of `bits` bits placed directly above `below` (or at bit 0).
    pub(crate) const fn after(below: Option<Field>, bits: u32) -> Field {
        let shift = match below {
            Some(f) => f.shift + f.bits,
            None => 0,
        };
        assert!(
            bits > 0 && shift + bits <= 64,
            "field does not fit in a u64"
        );
        Field { shift, bits }
    }

    /// The largest value the field holds.
    pub(crate) const fn max(self) -> u64 {
        if self.bits == 64 {
            u64::MAX
        } else {
            (1u64 << self.bits) - 1
        }
    }

    const fn mask(self) -> u64 {
        self.max() << self.shift
    }

    /// Reads the field out of `word`.
    #[inline(always)]
    pub(crate) const fn get(self, word: u64) -> u64 {
        (word & self.mask()) >> self.shift
    }

    /// Returns `word` with the field replaced by `value` (which must fit).
    #[inline(always)]
    pub(crate) const fn set(self, word: u64, value: u64) -> u64 {
        debug_assert!(value <= self.max());
        (word & !self.mask()) | (value << self.shift)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::Field;

    const LO: Field = Field::after(None, 16);
    const MID: Field = Field::after(Some(LO), 16);
    const HI: Field = Field::after(Some(MID), 32);

    #[test]
    fn fields_are_independent() {
        let w = HI.set(MID.set(LO.set(0, 0xBEEF), 0x1234), 0xDEAD_BEEF);
        assert_eq!(LO.get(w), 0xBEEF);
        assert_eq!(MID.get(w), 0x1234);
        assert_eq!(HI.get(w), 0xDEAD_BEEF);
        let w2 = MID.set(w, 0);
        assert_eq!(
            (LO.get(w2), MID.get(w2), HI.get(w2)),
            (0xBEEF, 0, 0xDEAD_BEEF)
        );
        assert_eq!(HI.max(), u32::MAX as u64);
    }
}
