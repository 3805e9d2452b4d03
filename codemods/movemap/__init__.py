"""The move map: its data model (``schema``) and how one is derived from two releases (``derive``)."""
