# See .zshenv beside this file.
ZDOTDIR=${COURSE_USER_ZDOTDIR:-$HOME}
if [[ -r $ZDOTDIR/.zshrc ]]; then source $ZDOTDIR/.zshrc; fi
ZDOTDIR=$__course_zdotdir
