# The terminal of `course lab`, for zsh. zsh reads its startup files from $ZDOTDIR, which `course lab`
# points here: each file here reads the learner's own file of the same name, and the last one
# (.zlogin) puts the course's commands first on PATH, in the folder JupyterLab asked for. A login
# shell's /etc/zprofile (macOS's path_helper) would otherwise put the system's folders first.
__course_dir=$PWD
__course_zdotdir=$ZDOTDIR
ZDOTDIR=${COURSE_USER_ZDOTDIR:-$HOME}
if [[ -r $ZDOTDIR/.zshenv ]]; then source $ZDOTDIR/.zshenv; fi
ZDOTDIR=$__course_zdotdir
