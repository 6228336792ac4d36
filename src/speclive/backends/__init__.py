"""Model backends behind one protocol (see ``base.Backend``)."""
