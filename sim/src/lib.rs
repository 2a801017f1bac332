//! `kvfence-sim`: reproduces the prefill/decode abort race on real bytes and shows that
//! kvfence removes it. See `kvfence-sim --help` and docs/DESIGN.md section 6.
//!
//! Modules: [`arena`] (page memory and the byte pattern), [`config`] (flags), [`rules`]
//! (naive / timeout / kvfence release rules), [`sim`] (threads and the decode scheduler),
//! [`repro`] (the deterministic reproducer), [`report`] (table, JSON, SVG).

#![warn(missing_docs)]

pub mod arena;
pub mod config;
pub mod report;
pub mod repro;
pub mod rng;
pub mod rules;
pub mod sim;
