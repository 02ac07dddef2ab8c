"""The task coordinator: one task model behind the zerotask JSON-RPC and vespid front ends."""
