# See .zshenv beside this file.
ZDOTDIR=${COURSE_USER_ZDOTDIR:-$HOME}
if [[ -r $ZDOTDIR/.zprofile ]]; then source $ZDOTDIR/.zprofile; fi
ZDOTDIR=$__course_zdotdir
