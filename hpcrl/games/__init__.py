"""Games bundled with hpcrl, written to the protocol of hpcrl.rl.games: examples to copy for your own."""
