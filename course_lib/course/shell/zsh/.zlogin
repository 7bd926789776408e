# See .zshenv beside this file: the last file a login zsh reads.
ZDOTDIR=${COURSE_USER_ZDOTDIR:-$HOME}
if [[ -r $ZDOTDIR/.zlogin ]]; then source $ZDOTDIR/.zlogin; fi
if [[ -n $COURSE_USER_ZDOTDIR ]]; then ZDOTDIR=$COURSE_USER_ZDOTDIR; else unset ZDOTDIR; fi
path=($COURSE_BIN $path)
export PATH
cd $__course_dir || true
unset __course_dir __course_zdotdir
rehash
