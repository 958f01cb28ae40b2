"""What a case should compute and what it costs: the eager computation, the float64 reference, the
agreement rule, and the FLOP and byte counts. Backends and the pair executor both stand on this
package; it imports neither."""
