"""Everything between "a user said X in chat C" and tokens."""
