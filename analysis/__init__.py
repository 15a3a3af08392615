"""Analyses built on softcert's bounds: experiments, radii, top-k, floating point, stability."""
