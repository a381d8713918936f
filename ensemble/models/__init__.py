"""Models: builders (where a member's network comes from), members (seeds, build, save/load), optimisers, cost."""
