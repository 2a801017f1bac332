"""End-to-end harness: SGLang 0.5.23's own Mooncake PD code, one process per role."""
