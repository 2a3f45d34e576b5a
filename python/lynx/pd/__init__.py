"""The engine-free prefill and decode sides of a Lynx transfer: rooms, encoder, data thread, control messages."""
