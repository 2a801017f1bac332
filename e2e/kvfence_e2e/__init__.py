"""kvfence end-to-end on Mooncake Transfer Engine (TCP, separate processes)."""
