"""The evolution loop: gates and statistics (pure), and the controller around them."""
