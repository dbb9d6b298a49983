"""canonrl's benchmark tools: references, running scripts, scoring (shared with tests/)."""
