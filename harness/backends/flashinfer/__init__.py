"""FlashInfer's planned wrappers: prefill and decode (dense, packed, paged) and its MLA paged decode."""
