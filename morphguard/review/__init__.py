"""The review console: people look at what the guard flagged, say whether it was right, and their
judgements feed thresholds and the combined check (`morphguard review`; docs/review.md)."""
