# tutti's version, set here and nowhere else: tuttid's (`tuttid --version`, the log's first line,
# AdminService Status) through //daemon:version, and the Python package's (`tutti.__version__`,
# the wheel //client/python:wheel, its metadata) through client/python/make_site.sh.
TUTTI_VERSION = "0.1.0"
