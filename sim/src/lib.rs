//! `kvfence-sim`: reproduces the prefill/decode abort race on real bytes and shows that
//! kvfence removes it. See `kvfence-sim --help` and docs/DESIGN.md section 6.
//!
//! Modules: [`arena`] (page memory and the byte pattern), [`config`] (settings, presets,
//! validation), [`cli`] (the command line),
//! [`rules`] (naive / timeout / sglang / vllm / acks-only / kvfence release rules),
//! [`sim`] (one rule's run: shared messages and threads), [`prefill`] (the rank threads),
//! [`decode`] (the decode scheduler), [`result`] (what a run measured), [`progress`]
//! (progress line), [`repro`] (the deterministic reproducer), [`report`] (table, JSON, SVG).

#![warn(missing_docs)]

pub mod arena;
pub mod cli;
pub mod config;
pub mod decode;
pub mod prefill;
pub mod progress;
pub mod report;
pub mod repro;
pub mod result;
pub mod rng;
pub mod rules;
pub mod sim;
