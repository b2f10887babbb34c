"""Measuring detectors: benchmark datasets, metrics, a resumable runner and reports."""
