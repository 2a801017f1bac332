//! `wire`: arbitrary bytes decoded as 16-byte wire forms. Every value must decode,
//! round-trip through `to_wire` and `to_bytes`, print, and be refused or accepted by a
//! table exactly as the model predicts (a value the table never issued is
//! `InvalidHandle`; an issued one is stale or the live lifecycle it names): never a panic.
#![no_main]

#[path = "../../tests/model/mod.rs"]
mod model;

use kvfence::{Config, RoomHandle, RoomTable};
use libfuzzer_sys::fuzz_target;
use model::{Harness, Op};

fuzz_target!(|data: &[u8]| {
    let config = Config::new(3, 16, 20);
    let table = RoomTable::new(config).expect("valid config");
    let mut h = Harness::new(&table, config).expect("harness primes");
    // A few live rooms, one closing, for forged handles to hit.
    let setup = [
        Op::Open {
            pages: 2,
            width: 3,
            mask: 0x3_0001,
            extra: 1,
        },
        Op::Open {
            pages: 1,
            width: 0,
            mask: 0,
            extra: 1,
        },
        Op::Begin { room: 1 },
        Op::Abort { room: 0 },
    ];
    for op in &setup {
        h.step(op).expect("setup matches the model");
    }
    for chunk in data.chunks(18) {
        let mut bytes = [0u8; 16];
        bytes[..chunk.len().min(16)].copy_from_slice(&chunk[..chunk.len().min(16)]);
        let handle = RoomHandle::from_bytes(bytes);
        let wire = u128::from_le_bytes(bytes);
        assert_eq!(handle.to_wire(), wire, "wire form round-trips");
        assert_eq!(handle.to_bytes(), bytes, "byte form round-trips");
        assert_eq!(RoomHandle::from_wire(handle.to_wire()), handle);
        assert_eq!(handle.index() as u128, wire >> 32 & 0xFFFF_FFFF);
        assert_eq!(u128::from(handle.generation()), wire & 0xFFFF_FFFF);
        let _ = (format!("{handle:?}"), handle.to_string());
        let action = chunk.get(16).copied().unwrap_or(0);
        let rank = chunk.get(17).copied().unwrap_or(0);
        for how in 0..4 {
            let op = Op::Forged {
                how,
                wire: (wire ^ wire >> 64) as u64,
                action,
                rank,
            };
            if let Err(e) = h.step(&op).and_then(|()| h.check()) {
                panic!("forged handle {wire:#x} ({op:?}): {e}");
            }
        }
    }
    if let Err(e) = h.finish_all() {
        panic!("final drain: {e}");
    }
});
