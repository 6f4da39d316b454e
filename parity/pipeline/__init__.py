"""What the stages do, as library functions (ARCHITECTURE.md layer 4)."""
