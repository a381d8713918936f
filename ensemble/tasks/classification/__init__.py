"""Classification: softmax members, soft/hard voting and the fitted aggregators, NLL/Brier/ECE."""
