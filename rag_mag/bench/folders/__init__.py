"""The real-documents benchmark: folders of files with questions (``collections``; the SQLite manual from Debian,
``debian_manual``), indexed by each system (``systems``), ranked and scored (``runner``), and reported (``report``)."""
