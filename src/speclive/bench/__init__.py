"""Benchmarks: prompt sets and measurement helpers."""
