"""``glmserve chat``: the terminal chat client."""
