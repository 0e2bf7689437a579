"""`python -m mt.export release|ctranslate2 RUN OUT`: see mt/export/formats.py."""

from mt.export.formats import main

main()
