//! Shuttle randomized-schedule tests for kvfence: see tests/ and README.md (built only with
//! `--cfg shuttle`; run `scripts/shuttle.sh`).
