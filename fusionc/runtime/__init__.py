"""Runtime: NVRTC compilation to cubins (works without a GPU), later loading and launching."""
